/**
 * Issue 41.1: transaction-held batches whose rows wait for a handler slot. One worker in
 * `leaseMode: "transaction"` drains `n` messages with a handler that sleeps `handlerMs` (each run recorded
 * in memory), the queue's `timeoutMs`, `concurrency` slots, `batchSize` and `leaseTtlMs` as given, and
 * `maxDeliveries: 5`. A batch waits idle in its transaction while its rows queue for the slots (and behind
 * the batch before it); before the fix the server's idle-in-transaction timeout ended it, and its rows ran
 * again until dead-lettered. Prints handler runs, messages run more than once, dead letters by reason and
 * what is still pending when the drain ends or `seconds` pass.
 *
 *   npx tsx bench/tx-batch-wait.ts [--shape 100,1000,5,200,3000,600] [--seconds 150]
 *   (shape: handlerMs,timeoutMs,concurrency,batchSize,leaseTtlMs,n; the second shape is
 *    300,2000,10,500,30000,2000)
 */
import pg from "pg";
import { migrate } from "../src/migrate/migrator.js";
import { createPublisher } from "../src/produce/publisher.js";
import { createWorker } from "../src/worker/worker.js";
import { arg, sleep } from "./lib.js";

const [handlerMs, timeoutMs, concurrency, batchSize, leaseTtlMs, n] = arg("shape", "100,1000,5,200,3000,600")
  .split(",")
  .map(Number) as [number, number, number, number, number, number];
const SECONDS = Number(arg("seconds", "150"));
const url = process.env.DATABASE_URL ?? "postgres://postgres@127.0.0.1:5432/test";
const schema = `bench_txwait_${process.pid}`;
const pool = new pg.Pool({ connectionString: url, max: 4 });
try {
  await migrate({ connection: pool, schema });
  const outbox = createPublisher({ schema });
  const client = await pool.connect();
  await client.query("BEGIN");
  await outbox.publishMany(
    client,
    "q",
    Array.from({ length: n }, (_, i) => ({ payload: { i } })),
  );
  await client.query("COMMIT");
  client.release();
  const runs = new Map<string, number>();
  const worker = createWorker({
    connection: url,
    schema,
    leaseMode: "transaction",
    concurrency,
    batchSize,
    leaseTtlMs,
    maxDeliveries: 5,
    logger: false,
    queues: {
      q: {
        timeoutMs,
        handler: async (_p, message) => {
          runs.set(message.id, (runs.get(message.id) ?? 0) + 1);
          await sleep(handlerMs);
        },
      },
    },
  });
  const started = Date.now();
  await worker.start();
  const count = async (sql: string) => (await pool.query<{ n: number }>(sql)).rows[0]?.n ?? 0;
  while ((await count(`SELECT count(*)::int AS n FROM "${schema}".messages`)) > 0) {
    if (Date.now() - started > SECONDS * 1000) break;
    await sleep(250);
  }
  await worker.stop();
  const dead = await pool.query<{ reason: string; n: number }>(
    `SELECT reason, count(*)::int AS n FROM "${schema}".dead_letters GROUP BY 1 ORDER BY 1`,
  );
  let total = 0;
  let again = 0;
  for (const v of runs.values()) {
    total += v;
    if (v > 1) again++;
  }
  console.log(
    JSON.stringify({
      shape: { handlerMs, timeoutMs, concurrency, batchSize, leaseTtlMs, n },
      seconds: (Date.now() - started) / 1000,
      handlerRuns: total,
      ranMoreThanOnce: again,
      pending: await count(`SELECT count(*)::int AS n FROM "${schema}".messages`),
      dead: Object.fromEntries(dead.rows.map((r) => [r.reason, r.n])),
    }),
  );
} finally {
  await pool.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
  await pool.end();
}
