/**
 * The keyed ack statement alone: `ack_keyed` (migration 0005: reads each delivery's row, then deletes it)
 * against `ack_key_heads` (0006: tries the key locks from the queue and key the worker passes, so the row
 * is read once, by its delete). Each run fills ROWS rows over KEYS keys (the ordering bench's 6a table),
 * then drains them on one connection: lease the heads with the worker's fetch statement, and ack up to 500
 * held rows per call, handing off the next row of each key, until none is left. The two functions run
 * interleaved, run by run; the figure is the ack statement's wall time per row (median of runs).
 *
 *   node --import tsx bench/keyed-ack.ts --rows 50000 --keys 10000 --runs 6
 */
import { randomUUID } from "node:crypto";
import pg from "pg";
import { type HeldRow, heldRows } from "../src/lease/held.js";
import { type AckKeyedRow, completeStatements } from "../src/sql/complete.js";
import { plainArray, runQuery, textArray } from "../src/sql/executor.js";
import { outboxNames } from "../src/sql/names.js";
import { arg, DATABASE_URL, machine, median, range } from "./lib.js";
import { benchLeaseStore, outboxPeer } from "./peers/outbox.js";

const rows = Number(arg("rows", "50000"));
const keys = Number(arg("keys", "10000"));
const runs = Number(arg("runs", "6"));
const BATCH = 500;
const schema = "bench_keyed_ack";
const names = outboxNames(schema);
const pool = new pg.Pool({ connectionString: DATABASE_URL, max: 2 });
const sql = completeStatements(names, { synchronousCommit: false });
const store = benchLeaseStore(pool, schema);

type Fn = "ack_keyed" | "ack_key_heads";
type Promoted = Extract<AckKeyedRow, { kind: "promoted" }>;

/** Drains the filled table; returns the ack statement's milliseconds per row. */
async function drain(fn: Fn): Promise<number> {
  const peer = outboxPeer(schema);
  await peer.setup();
  await peer.fill(rows, keys);
  const client = await pool.connect();
  let ackMs = 0;
  let acked = 0;
  try {
    const pending: HeldRow[] = [];
    for (;;) {
      if (pending.length < BATCH) {
        const lease = await store.lease(BATCH - pending.length);
        pending.push(...heldRows(lease.token, lease.rows));
      }
      if (pending.length === 0) break;
      const batch = pending.splice(0, BATCH);
      const handOff = { limit: batch.length, token: randomUUID(), leaseTtlMs: 60_000, workerId: "bench" };
      const pairs = {
        ids: plainArray(batch.map((h) => h.id)),
        tokens: plainArray(batch.map((h) => h.token)),
      };
      const started = performance.now();
      const answer =
        fn === "ack_keyed"
          ? await runQuery(client, sql.ackKeyed, { ...pairs, ...handOff }, { prepared: true })
          : await runQuery(
              client,
              sql.ackKeyHeads,
              {
                ...pairs,
                queues: textArray(batch.map((h) => h.row.queue)),
                keys: textArray(batch.map((h) => h.key ?? null)),
                ...handOff,
              },
              { prepared: true },
            );
      ackMs += performance.now() - started;
      acked += batch.length;
      const next = answer.filter((r): r is Promoted => r.kind === "promoted" && r.taken);
      pending.push(...heldRows(handOff.token, next));
    }
  } finally {
    client.release();
  }
  if (acked !== rows) throw new Error(`acked ${acked} of ${rows} rows`);
  await peer.teardown();
  return ackMs / acked;
}

const results: Record<Fn, number[]> = { ack_keyed: [], ack_key_heads: [] };
for (let r = 0; r < runs; r++) {
  for (const fn of ["ack_keyed", "ack_key_heads"] as const) results[fn].push(await drain(fn));
}
const us = (xs: number[]) => xs.map((x) => x * 1000);
console.log(`${await machine(pool)}; ${rows} rows over ${keys} keys, ${runs} runs interleaved`);
console.log("| function | ack µs per row (median) | range |");
console.log("|---|---:|---:|");
for (const fn of ["ack_keyed", "ack_key_heads"] as const) {
  console.log(`| \`${fn}\` | ${median(us(results[fn])).toFixed(1)} | ${range(us(results[fn]), 1)} |`);
}
console.log(
  `ack_key_heads ÷ ack_keyed: ${(median(results.ack_key_heads) / median(results.ack_keyed)).toFixed(2)}×`,
);
await pool.end();
