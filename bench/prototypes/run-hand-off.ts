/**
 * A design not in the product, measured before building it: the keyed hand-off as runs. Today an ack of a
 * key's head promotes and leases the next row of its key, one row per ack, each with a descent of the key
 * index, a key lock and a promotion. A run hand-off leases the next (up to `--run`) due rows of the key at
 * once (one descent); the worker runs them in order, and acks all but the run's last as plain deletes (no
 * lock, no descent, no promotion). run-hand-off.sql holds the prototype functions, made in the bench schema.
 *
 * One connection drains 50,000 rows over 10,000 keys (the ordering bench's 6a table) the way a worker does,
 * without handlers: the worker's fetch for the heads, then acks of up to 500 runnable rows (one per key; a
 * key's next row becomes runnable once its predecessor's ack returned), the hand-offs joining in. Modes
 * interleaved per round: keyless (fetch and the plain ack), today's keyed ack (`ack_key_heads`), runs. The
 * figure is the wall time of the statements per row. (Built in full afterwards and measured in whole
 * drains, the design made them no faster, and was not merged: bench/RESULTS.md, session 5.)
 *
 *   node --import tsx bench/prototypes/run-hand-off.ts --runs 5 --run 8
 */
import { randomUUID } from "node:crypto";
import { readFileSync } from "node:fs";
import pg from "pg";
import { completeStatements } from "../../src/sql/complete.js";
import { plainArray, runQuery, textArray } from "../../src/sql/executor.js";
import { outboxNames } from "../../src/sql/names.js";
import { arg, DATABASE_URL, median, range } from "../lib.js";
import { benchLeaseStore, outboxPeer } from "../peers/outbox.js";
import { QUEUE } from "../peers/peer.js";

const ROWS = 50_000;
const KEYS = 10_000;
const BATCH = 500;
const runs = Number(arg("runs", "5"));
const runLength = Number(arg("run", "8"));
const schema = "bench_run_hand_off";
const names = outboxNames(schema);
const pool = new pg.Pool({ connectionString: DATABASE_URL, max: 2 });
const sql = completeStatements(names, { synchronousCommit: false });
const store = benchLeaseStore(pool, schema);
const functions = readFileSync(new URL("./run-hand-off.sql", import.meta.url), "utf8").replaceAll(
  "{{schema}}",
  names.quotedSchema,
);

type Mode = "keyless" | "keyed" | "runs";
interface Held {
  id: string;
  key: string | null;
  token: string;
}

/** Drains a fresh table in `mode`: statement milliseconds per row. */
async function drain(mode: Mode): Promise<number> {
  const peer = outboxPeer(schema);
  await peer.setup();
  await peer.fill(ROWS, mode === "keyless" ? undefined : KEYS);
  const client = await pool.connect();
  if (mode === "runs") await client.query(functions);
  let ms = 0;
  let done = 0;
  const runnable: Held[] = [];
  // A key's rows held behind its runnable one, in id order.
  const waiting = new Map<string, Held[]>();
  const take = (token: string, rows: readonly { id: string; key: string | null }[]) => {
    for (const r of [...rows].sort((a, b) => Number(a.id) - Number(b.id))) {
      const held = { id: r.id, key: r.key, token };
      const behind = r.key === null ? undefined : waiting.get(r.key);
      if (behind) behind.push(held);
      else {
        if (r.key !== null) waiting.set(r.key, []);
        runnable.push(held);
      }
    }
  };
  try {
    for (;;) {
      let started = performance.now();
      if (runnable.length < BATCH) {
        const lease = await store.lease(BATCH - runnable.length);
        take(lease.token, lease.rows);
      }
      ms += performance.now() - started;
      if (runnable.length === 0) break;
      const batch = runnable.splice(0, BATCH);
      const hand = randomUUID();
      const pairs = {
        ids: plainArray(batch.map((h) => h.id)),
        tokens: plainArray(batch.map((h) => h.token)),
      };
      const keys = textArray(batch.map((h) => h.key));
      const queues = textArray(batch.map(() => QUEUE));
      started = performance.now();
      let handed: { id: string; key: string | null }[] = [];
      if (mode === "keyless") {
        await runQuery(client, sql.ack, pairs, { prepared: true });
      } else if (mode === "keyed") {
        const params = { ...pairs, queues, keys, limit: batch.length, token: hand, leaseTtlMs: 60_000 };
        const answer = await runQuery(
          client,
          sql.ackKeyHeads,
          { ...params, workerId: "bench" },
          { prepared: true },
        );
        for (const r of answer) if (r.kind === "promoted" && r.taken) handed.push(r);
      } else {
        const last = batch.map((h) => (h.key === null ? true : (waiting.get(h.key)?.length ?? 0) === 0));
        const answer = await client.query({
          name: "bench_ack_runs",
          text: `SELECT * FROM ${names.quotedSchema}.ack_runs($1::bigint[], $2::uuid[], $3::text[], $4::text[], $5::boolean[], $6::uuid, 60000, 'bench', $7::int)`,
          values: [pairs.ids, pairs.tokens, queues, keys, `{${last.join(",")}}`, hand, runLength],
        });
        handed = answer.rows;
      }
      ms += performance.now() - started;
      done += batch.length;
      for (const h of batch) {
        const behind = h.key === null ? undefined : waiting.get(h.key);
        const next = behind?.shift();
        if (next) runnable.push(next);
        else if (h.key !== null) waiting.delete(h.key);
      }
      take(hand, handed);
    }
  } finally {
    client.release();
  }
  const left = (await pool.query(`SELECT count(*)::int AS n FROM ${names.messages}`)).rows[0].n;
  if (done !== ROWS || left !== 0) throw new Error(`${mode}: acked ${done} of ${ROWS}, ${left} left`);
  await peer.teardown();
  return (ms * 1000) / done;
}

const us: Record<Mode, number[]> = { keyless: [], keyed: [], runs: [] };
for (let r = 0; r < runs; r++)
  for (const mode of ["keyless", "keyed", "runs"] as const) us[mode].push(await drain(mode));
console.log(`${ROWS} rows over ${KEYS} keys, run length ${runLength}, ${runs} rounds interleaved`);
console.log("| mode | fetch + ack µs per row (median) | range |");
console.log("|---|---:|---:|");
for (const mode of ["keyless", "keyed", "runs"] as const) {
  console.log(`| ${mode} | ${median(us[mode]).toFixed(1)} | ${range(us[mode], 1)} |`);
}
console.log(`runs ÷ keyed: ${(median(us.runs) / median(us.keyed)).toFixed(2)}×`);
await pool.end();
