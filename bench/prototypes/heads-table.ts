/**
 * Would a table of current key heads make the ordered drain cost what the keyless one does? The redesign
 * session 17's analysis pointed at (issue 30): today a key's next row is promoted by an UPDATE of its
 * `messages` row that cannot be HOT (`head` decides which partial index holds it, so every index of the row
 * gets an entry); here the heads live in a small table of their own, one row per key with its head's id,
 * due time and lease, and `messages` rows of keyed queues are never updated: a lease is a HOT update of the
 * small head row, the ack deletes the message and moves its key's head row to the next id (or deletes it).
 *
 * Three drains of the same backlog (50,000 rows of ~100-byte payloads; the keyed ones over 10,000 keys), on
 * one connection, statements only (no worker), 500 a batch, the ack handing the next row of each key to the
 * same batch as the worker does; interleaved, run by run:
 * - keyless: the product's fetch and fenced ack;
 * - keyed, product: the product's fetch and `ack_key_heads` (promotion and hand-off);
 * - keyed, heads table: the statements below, on tables made for the run (the key locks tried as the
 *   product does; producers, retries and crash repair are not modelled: this bounds the gain, it is not
 *   the design).
 * Figures: the backend's CPU (/proc) and the statements' wall time per message, median of runs.
 *
 *   node --import tsx bench/prototypes/heads-table.ts [--runs 5] [--rows 50000] [--keys 10000]
 */
import { randomUUID } from "node:crypto";
import { readFileSync } from "node:fs";
import pg from "pg";
import { type AckKeyedRow, completeStatements } from "../../src/sql/complete.js";
import { plainArray, runQuery, textArray } from "../../src/sql/executor.js";
import { fetchStatement, LEASED_COLUMNS, type LeasedRow } from "../../src/sql/fetch.js";
import { outboxNames } from "../../src/sql/names.js";
import { arg, DATABASE_URL, median, PAYLOAD_SQL, range } from "../lib.js";
import { outboxPeer } from "../peers/outbox.js";
import { QUEUE } from "../peers/peer.js";

const runs = Number(arg("runs", "5"));
const rows = Number(arg("rows", "50000"));
const keys = Number(arg("keys", "10000"));
const BATCH = 500;
const TTL_MS = 60_000;
const product = "bench_heads_product";
const names = outboxNames(product);
const heads = "bench_heads_table";
// One connection for everything: its backend's CPU is the drain's Postgres CPU.
const pool = new pg.Pool({ connectionString: DATABASE_URL, max: 1, idleTimeoutMillis: 0 });
const settings = { synchronousCommit: false };
const sql = completeStatements(names, settings);
const fetch = fetchStatement(names, settings, true);

async function backendCpuUs(): Promise<number> {
  const pid = (await pool.query<{ pid: number }>("SELECT pg_backend_pid() AS pid")).rows[0]?.pid;
  const fields = readFileSync(`/proc/${pid}/stat`, "utf8").split(") ")[1]?.split(" ") ?? [];
  return (Number(fields[11]) + Number(fields[12])) * 10_000;
}

interface Held {
  id: string;
  token: string;
  key: string | null;
}
const held = (token: string, leased: readonly Pick<LeasedRow, "id" | "key">[]): Held[] =>
  leased.map((r) => ({ id: r.id, token, key: r.key }));

/** Drains with `lease` and `ack` until nothing is left → [backend CPU µs, wall µs] per message. */
async function drain(
  lease: (limit: number, token: string) => Promise<Held[]>,
  ack: (batch: Held[]) => Promise<Held[]>,
): Promise<[number, number]> {
  const cpu0 = await backendCpuUs();
  const t0 = performance.now();
  let done = 0;
  const pending: Held[] = [];
  for (;;) {
    if (pending.length < BATCH) pending.push(...(await lease(BATCH - pending.length, randomUUID())));
    if (pending.length === 0) break;
    const batch = pending.splice(0, BATCH);
    pending.push(...(await ack(batch)));
    done += batch.length;
  }
  const wall = (performance.now() - t0) * 1000;
  const cpu = (await backendCpuUs()) - cpu0;
  if (done !== rows) throw new Error(`acked ${done} of ${rows}`);
  return [cpu / done, wall / done];
}

async function productDrain(keyed: boolean): Promise<[number, number]> {
  const peer = outboxPeer(product);
  await peer.setup();
  await peer.fill(rows, keyed ? keys : 0);
  const lease = async (limit: number, token: string) =>
    held(
      token,
      await runQuery(
        pool,
        fetch,
        { queues: [QUEUE], limit, token, leaseTtlMs: TTL_MS, workerId: "bench" },
        { prepared: true },
      ),
    );
  const result = await drain(lease, async (batch) => {
    const pairs = { ids: plainArray(batch.map((h) => h.id)), tokens: plainArray(batch.map((h) => h.token)) };
    if (!keyed) {
      await runQuery(pool, sql.ack, pairs, { prepared: true });
      return [];
    }
    const handOff = { limit: batch.length, token: randomUUID(), leaseTtlMs: TTL_MS, workerId: "bench" };
    const answer = await runQuery(
      pool,
      sql.ackKeyHeads,
      {
        ...pairs,
        queues: textArray(batch.map(() => QUEUE)),
        keys: textArray(batch.map((h) => h.key)),
        ...handOff,
      },
      { prepared: true },
    );
    const next = answer.filter(
      (r): r is Extract<AckKeyedRow, { kind: "promoted" }> => r.kind === "promoted" && r.taken === true,
    );
    return held(handOff.token, next);
  });
  await peer.teardown();
  return result;
}

const h = `"${heads}"`;
const columns = LEASED_COLUMNS.replace("t.deliveries_count,", "l.deliveries_count,");
const headsLease: pg.QueryConfig = {
  name: "heads_lease",
  // The head rows are locked by the scan (SKIP LOCKED), so their ctid is theirs for the statement.
  text: `WITH picked AS (
  SELECT ctid FROM ${h}.heads WHERE queue = $1 AND available_at <= now()
    AND (acquired_token IS NULL OR lease_expires_at <= now())
  ORDER BY available_at, id LIMIT $2 FOR UPDATE SKIP LOCKED
), leased AS (
  UPDATE ${h}.heads AS k SET acquired_token = $3::uuid, lease_expires_at = now() + $4::double precision * interval '1 millisecond',
    acquired_by = 'bench', deliveries_count = k.deliveries_count + 1
  WHERE k.ctid = ANY (ARRAY(SELECT ctid FROM picked))
  RETURNING k.id, k.deliveries_count
)
SELECT ${columns} FROM leased AS l JOIN ${h}.messages AS t ON t.id = l.id`,
};
const headsAck: pg.QueryConfig = {
  name: "heads_ack",
  text: `WITH d AS MATERIALIZED (
  SELECT d.id, d.token, d.key, pg_try_advisory_xact_lock(hashtext($3::text), hashtext(d.key)) AS locked
  FROM unnest($1::bigint[], $2::uuid[], $4::text[]) AS d(id, token, key)
), gone AS (
  -- Fenced by the head row's token: the message row holds no lease.
  DELETE FROM ${h}.messages AS t USING d, ${h}.heads AS k
  WHERE t.id = d.id AND d.locked AND k.queue = $3 AND k.key = d.key AND k.id = d.id AND k.acquired_token = d.token
  RETURNING t.id, t.key
), next AS (
  SELECT g.key, n.id, n.available_at FROM gone AS g
  LEFT JOIN LATERAL (
    SELECT m.id, m.available_at FROM ${h}.messages AS m WHERE m.queue = $3 AND m.key = g.key AND m.id > g.id
    ORDER BY m.id LIMIT 1
  ) AS n ON true
), moved AS (
  -- The hand-off: the next row of the key is leased by the same write that makes it head.
  UPDATE ${h}.heads AS k SET id = n.id, available_at = n.available_at,
    acquired_token = CASE WHEN n.available_at <= now() THEN $5::uuid END,
    lease_expires_at = CASE WHEN n.available_at <= now() THEN now() + $6::double precision * interval '1 millisecond' END,
    deliveries_count = CASE WHEN n.available_at <= now() THEN 1 ELSE 0 END
  FROM next AS n WHERE k.queue = $3 AND k.key = n.key AND n.id IS NOT NULL
  RETURNING k.id, k.deliveries_count, k.acquired_token
), dropped AS (
  DELETE FROM ${h}.heads AS k USING next AS n WHERE k.queue = $3 AND k.key = n.key AND n.id IS NULL
)
SELECT ${columns} FROM moved AS l JOIN ${h}.messages AS t ON t.id = l.id WHERE l.acquired_token IS NOT NULL`,
};

async function headsDrain(): Promise<[number, number]> {
  await pool.query(`DROP SCHEMA IF EXISTS ${h} CASCADE; CREATE SCHEMA ${h}`);
  await pool.query(`CREATE TABLE ${h}.messages (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, queue text NOT NULL, payload jsonb NOT NULL,
    headers jsonb NOT NULL DEFAULT '{}', key text NOT NULL, created_at timestamptz NOT NULL DEFAULT now(),
    available_at timestamptz NOT NULL DEFAULT now(), deliveries_count integer NOT NULL DEFAULT 0,
    attempts_count integer NOT NULL DEFAULT 0, failures_count integer NOT NULL DEFAULT 0,
    first_attempt_at timestamptz, last_attempt_at timestamptz)`);
  await pool.query(`CREATE INDEX ON ${h}.messages (queue, key, id)`);
  await pool.query(`CREATE TABLE ${h}.heads (
    queue text NOT NULL, key text NOT NULL, id bigint NOT NULL, available_at timestamptz NOT NULL,
    acquired_token uuid, lease_expires_at timestamptz, acquired_by text, deliveries_count integer NOT NULL DEFAULT 0,
    PRIMARY KEY (queue, key)) WITH (fillfactor = 50)`);
  await pool.query(`CREATE INDEX ON ${h}.heads (queue, available_at, id)`);
  await pool.query(
    `INSERT INTO ${h}.messages (queue, payload, key)
     SELECT '${QUEUE}', ${PAYLOAD_SQL}, 'k' || (g % ${keys}) FROM generate_series(1, ${rows}) AS g`,
  );
  await pool.query(
    `INSERT INTO ${h}.heads (queue, key, id, available_at)
     SELECT DISTINCT ON (queue, key) queue, key, id, available_at FROM ${h}.messages ORDER BY queue, key, id`,
  );
  // One statement each: VACUUM refuses the implicit transaction of a multi-statement string.
  for (const table of ["messages", "heads"]) await pool.query(`VACUUM ANALYZE ${h}.${table}`);
  await pool.query("CHECKPOINT");
  const lease = async (limit: number, token: string) =>
    held(token, (await pool.query({ ...headsLease, values: [QUEUE, limit, token, TTL_MS] })).rows);
  const result = await drain(lease, async (batch) => {
    const token = randomUUID();
    const answer = await pool.query({
      ...headsAck,
      values: [
        batch.map((b) => b.id),
        batch.map((b) => b.token),
        QUEUE,
        batch.map((b) => b.key),
        token,
        TTL_MS,
      ],
    });
    return held(token, answer.rows);
  });
  await pool.query(`DROP SCHEMA ${h} CASCADE`);
  return result;
}

const shapes = {
  keyless: () => productDrain(false),
  "keyed, product (`ack_key_heads`)": () => productDrain(true),
  "keyed, heads table": headsDrain,
};
const results = new Map<string, [number, number][]>();
for (let r = 0; r < runs; r++) {
  for (const [name, run] of Object.entries(shapes)) {
    const got = results.get(name) ?? [];
    got.push(await run());
    results.set(name, got);
  }
}
const keyless = results.get("keyless") ?? [];
console.log(`${rows} rows (keyed: over ${keys} keys), ${runs} runs interleaved, median (range)`);
console.log("| drain | Postgres backend CPU µs/msg | ÷ keyless | statements' wall µs/msg |");
console.log("| --- | ---: | ---: | ---: |");
for (const [name, got] of results) {
  const cpu = got.map((g) => g[0]);
  const wall = got.map((g) => g[1]);
  console.log(
    `| ${name} | ${median(cpu).toFixed(1)} (${range(cpu, 1)}) | ${(median(cpu) / median(keyless.map((g) => g[0]))).toFixed(2)}× | ${median(wall).toFixed(1)} (${range(wall, 1)}) |`,
  );
}
await pool.end();
