/**
 * What the plpgsql wrapper costs the keyed hand-off: the promotion of a key's next row as the worker gets
 * it (`promote_heads`, whose `RETURN QUERY` copies each row, payload included, into a result store before
 * the caller reads it; `ack_key_heads` copies them once more) against the same UPDATE sent as a statement,
 * whose RETURNING rows go straight to the client.
 *
 * One connection, the product's schema (migrated). Each round: 1,000 keys with 3 rows each, heads deleted
 * by hand, then half the keys promoted (and their next rows leased, as a hand-off) by the function and half
 * by the plain statement, alternating which goes first. Prints the median µs per promoted row of each.
 *
 *   node --import tsx bench/prototypes/promote-return.ts --rounds 20
 */
import { randomUUID } from "node:crypto";
import pg from "pg";
import { loadMigrationFiles, renderMigration } from "../../src/migrate/migration-files.js";
import { migrate } from "../../src/migrate/migrator.js";
import { outboxNames } from "../../src/sql/names.js";
import { arg, DATABASE_URL, median } from "../lib.js";

const rounds = Number(arg("rounds", "20"));
const schema = "bench_promote_return";
const names = outboxNames(schema);
const m = names.messages;
const KEYS = 1000;
const client = new pg.Client({ connectionString: DATABASE_URL });
await client.connect();
await client.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
await migrate({ connection: DATABASE_URL, schema });

/**
 * promote_heads' own body (migration 0003, read from the file, so the two ways run the same SQL), with its
 * arguments as statement parameters.
 */
async function promoteStatement(): Promise<string> {
  const file = (await loadMigrationFiles()).find((f) => f.name === "0003_key_heads");
  if (file === undefined) throw new Error("migration 0003_key_heads not found");
  const sql = renderMigration(file, names);
  const start = sql.indexOf("RETURN QUERY", sql.indexOf(".promote_heads("));
  const body = sql.slice(start + "RETURN QUERY".length, sql.indexOf(";\nEND", start));
  const args: Record<string, string> = {
    queues: "$1::text[]",
    keys: "$2::text[]",
    hand_off: "$3::int",
    hand_token: "$4::uuid",
    lease_ttl_ms: "$5::double precision",
    worker_id: "$6::text",
  };
  return body.replace(
    /\b(queues|keys|hand_off|hand_token|lease_ttl_ms|worker_id)\b/g,
    (arg) => args[arg] as string,
  );
}
const plain = await promoteStatement();
const viaFunction = `SELECT * FROM ${names.quotedSchema}.promote_heads($1::text[], $2::text[], $3::int, $4::uuid, $5::double precision, $6::text)`;

const times = { function: [] as number[], statement: [] as number[] };
for (let round = 0; round < rounds; round++) {
  await client.query(`TRUNCATE ${m}`);
  // Through the key-head trigger, as publish writes them: the first row of each key is its head.
  await client.query(
    `INSERT INTO ${m} (queue, payload, key)
     SELECT 'q', '{"n": 1, "pad": "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}', 'k' || (g % ${KEYS})
     FROM generate_series(1, ${3 * KEYS}) AS g ORDER BY g`,
  );
  await client.query(`DELETE FROM ${m} WHERE head`);
  await client.query(`VACUUM ANALYZE ${m}`);
  const keys = Array.from({ length: KEYS }, (_, i) => `k${i}`);
  const halves = { function: keys.slice(0, KEYS / 2), statement: keys.slice(KEYS / 2) };
  const order = round % 2 === 0 ? (["function", "statement"] as const) : (["statement", "function"] as const);
  for (const way of order) {
    const ks = halves[way];
    const params = [ks.map(() => "q"), ks, ks.length, randomUUID(), 30_000, "bench"];
    const started = performance.now();
    const { rows } = await client.query(way === "function" ? viaFunction : plain, params);
    const ms = performance.now() - started;
    if (rows.length !== ks.length) throw new Error(`${way}: promoted ${rows.length} of ${ks.length}`);
    times[way].push((ms * 1000) / rows.length);
  }
}
await client.query(`DROP SCHEMA ${schema} CASCADE`);
await client.end();
for (const way of ["function", "statement"] as const) {
  console.log(`${way.padEnd(9)} ${median(times[way]).toFixed(1)} µs per promoted row`);
}
