/**
 * What receiving a lease's rows costs the worker process, by the columns they carry: the CPU of node
 * (pg's protocol parser and row builder) and of the Postgres backend (output functions) per row, for the
 * fetch's column list (LEASED_COLUMNS) and for narrower or differently packed shapes. The rows are read,
 * not leased: the lease's writes are the same in every shape.
 *
 * One connection, the product's schema (migrated), 500 rows of ~100-byte payloads; each shape's statement
 * runs 300 times a round (named, as the worker prepares it), shapes interleaved, 5 rounds; median.
 *
 *   node --import tsx bench/prototypes/lease-columns.ts [--rounds 5]
 */
import { readFileSync } from "node:fs";
import type pg from "pg";
import { LEASED_COLUMNS } from "../../src/sql/fetch.js";
import { arg, median, PAYLOAD_SQL } from "../lib.js";
import { freshSchema } from "./schema.js";

const rounds = Number(arg("rounds", "5"));
const PER_ROUND = 300;
const ROWS = 500;
const schema = "bench_lease_columns";
const { client, messages: m } = await freshSchema(schema);
await client.query(
  `INSERT INTO ${m} (queue, payload) SELECT 'bench', ${PAYLOAD_SQL} FROM generate_series(1, ${ROWS}) AS g`,
);
await client.query(`VACUUM ANALYZE ${m}`);
const backend = (await client.query<{ pid: number }>("SELECT pg_backend_pid() AS pid")).rows[0]?.pid;

/** CPU µs of this connection's backend so far (Linux /proc; utime + stime in 10 ms ticks). */
function backendCpuUs(): number {
  const fields = readFileSync(`/proc/${backend}/stat`, "utf8").split(") ")[1]?.split(" ") ?? [];
  return (Number(fields[11]) + Number(fields[12])) * 10_000;
}

const rowsOf = `(SELECT * FROM ${m} ORDER BY id LIMIT ${ROWS}) AS t`;
// The rarely set columns: attempts, failures and their times are 0 / NULL on a first delivery.
const history = `CASE WHEN t.attempts_count > 0 OR t.failures_count > 0 THEN concat_ws(',', t.attempts_count, t.failures_count, date_part('epoch', t.first_attempt_at), date_part('epoch', t.last_attempt_at)) END AS history`;
const common = `t.id::text AS id, t.payload::text AS payload, NULLIF(t.headers, '{}'::jsonb) AS headers, t.key, date_part('epoch', t.created_at) AS created_epoch, t.deliveries_count`;
const shapes: { name: string; text: string; read?: (r: pg.QueryResult) => unknown }[] = [
  { name: "the fetch's 11 columns (LEASED_COLUMNS)", text: `SELECT ${LEASED_COLUMNS} FROM ${rowsOf}` },
  {
    name: "the same, headers NULL when empty",
    text: `SELECT ${LEASED_COLUMNS.replace("t.headers,", "NULLIF(t.headers, '{}'::jsonb) AS headers,")} FROM ${rowsOf}`,
  },
  {
    name: "… and the four history columns as one (NULL when unset)",
    text: `SELECT t.queue, ${common}, ${history} FROM ${rowsOf}`,
  },
  { name: "… and no queue column (one queue)", text: `SELECT ${common}, ${history} FROM ${rowsOf}` },
  { name: "id and payload (the floor's columns)", text: `SELECT t.id, t.payload FROM ${rowsOf}` },
  { name: "one constant column", text: `SELECT 1 AS x FROM ${rowsOf}` },
  {
    name: "the 11 columns as one JSON array (json_agg), parsed in node",
    text: `SELECT json_agg(json_build_array(t.id::text, t.queue, t.payload::text, t.headers, t.key, date_part('epoch', t.created_at), t.deliveries_count, t.attempts_count, t.failures_count, t.first_attempt_at, t.last_attempt_at))::text AS x FROM ${rowsOf}`,
    read: (r) =>
      (JSON.parse((r.rows[0] as { x: string }).x) as unknown[][]).map((a) => ({
        id: a[0],
        queue: a[1],
        payload: a[2],
        headers: a[3],
        key: a[4],
        created_epoch: a[5],
        deliveries_count: a[6],
        attempts_count: a[7],
        failures_count: a[8],
        first_attempt_at: a[9] ? new Date(a[9] as string) : null,
        last_attempt_at: a[10] ? new Date(a[10] as string) : null,
      })),
  },
];

/** One run of the statement, read as the worker would read it (an optional call would skip the query). */
async function readOnce(shape: (typeof shapes)[number], query: pg.QueryConfig): Promise<void> {
  const result = await client.query(query);
  shape.read?.(result);
}

const results = new Map<string, { node: number[]; backend: number[] }>();
for (let round = 0; round < rounds; round++) {
  for (const [i, shape] of shapes.entries()) {
    const query = { name: `lease_columns_${i}`, text: shape.text };
    for (let w = 0; w < 20; w++) await readOnce(shape, query);
    const node0 = process.cpuUsage();
    const backend0 = backendCpuUs();
    for (let n = 0; n < PER_ROUND; n++) await readOnce(shape, query);
    const node = process.cpuUsage(node0);
    const r = results.get(shape.name) ?? { node: [], backend: [] };
    r.node.push((node.user + node.system) / (PER_ROUND * ROWS));
    r.backend.push((backendCpuUs() - backend0) / (PER_ROUND * ROWS));
    results.set(shape.name, r);
  }
}
console.log(`| shape (${ROWS} rows a statement) | node CPU µs/row | Postgres backend CPU µs/row |`);
console.log("| --- | ---: | ---: |");
for (const [name, r] of results) {
  console.log(`| ${name} | ${median(r.node).toFixed(2)} | ${median(r.backend).toFixed(2)} |`);
}
await client.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
await client.end();
