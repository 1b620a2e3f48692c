/**
 * What a keyed row costs Postgres to lease and delete, against a keyless one, apart from everything else
 * the keyed drain does (locks, promotion, hand-off): the question is whether the keyed drain's extra time
 * is in the per-row writes (a keyed row is in one more index, written again by every lease).
 *
 * One connection, the product's schema (migrated), 100,000 rows, every other one keyed over 20,000 keys.
 * Each round leases 500 unleased rows of one kind by id with the fetch's SET list, then deletes them;
 * keyless and keyed rounds alternate. Prints the median µs per row of each statement.
 *
 *   node --import tsx bench/prototypes/row-writes.ts --rounds 40
 */
import { randomUUID } from "node:crypto";
import { arg, median } from "../lib.js";
import { freshSchema } from "./schema.js";

const rounds = Number(arg("rounds", "40"));
const schema = "bench_row_writes";
const { client, messages: m } = await freshSchema(schema);
await client.query(
  `INSERT INTO ${m} (queue, payload, key)
   SELECT 'q', '{"n": 1, "pad": "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}',
          CASE WHEN g % 2 = 0 THEN 'k' || (g % 20000) END
   FROM generate_series(1, 100000) AS g`,
);
await client.query(`VACUUM ANALYZE ${m}`);

type Kind = "keyless" | "keyed";
const times: Record<Kind, { lease: number[]; remove: number[] }> = {
  keyless: { lease: [], remove: [] },
  keyed: { lease: [], remove: [] },
};
for (let round = 0; round < rounds; round++) {
  for (const kind of ["keyless", "keyed"] as const) {
    const { rows } = await client.query<{ id: string }>(
      `SELECT id::text AS id FROM ${m} WHERE acquired_token IS NULL AND key IS ${kind === "keyed" ? "NOT " : ""}NULL
       ORDER BY id LIMIT 500`,
    );
    const ids = rows.map((r) => r.id);
    if (ids.length < 500) throw new Error(`only ${ids.length} ${kind} rows left: fewer rounds`);
    let started = performance.now();
    await client.query(
      `UPDATE ${m} AS t SET acquired_token = $2::uuid, acquired_at = now(),
         lease_expires_at = now() + interval '30 seconds', acquired_by = 'bench',
         deliveries_count = t.deliveries_count + 1
       WHERE t.id = ANY ($1::bigint[])`,
      [ids, randomUUID()],
    );
    times[kind].lease.push(((performance.now() - started) * 1000) / ids.length);
    started = performance.now();
    await client.query(`DELETE FROM ${m} WHERE id = ANY ($1::bigint[])`, [ids]);
    times[kind].remove.push(((performance.now() - started) * 1000) / ids.length);
  }
}
await client.query(`DROP SCHEMA ${schema} CASCADE`);
await client.end();
for (const kind of ["keyless", "keyed"] as const) {
  console.log(
    `${kind.padEnd(8)} lease ${median(times[kind].lease).toFixed(1)} µs/row, delete ${median(times[kind].remove).toFixed(1)} µs/row`,
  );
}
