/**
 * `cancel` racing a worker (issue 41, item 4). N keyed messages, each with a dedupe key; one worker drains
 * them while N cancels (one per dedupe key, each in its own short transaction) start at random moments of
 * the drain. Handlers take a few ms and record every run in a ledger. Reports, per lease mode:
 *
 * - cancels answered `cancelled` for a message the ledger shows ran (must be 0);
 * - messages whose handler ran more than once (a batch that committed without its ack);
 * - each cancel's wall time (p50, p99, max), and what the cancels answered;
 * - one cancel of a message whose handler is blocked for `--hold` ms: its answer and wall time.
 *
 *   node --import tsx bench/cancel-race.ts --messages 200 --keys 20 --hold 4000 --modes transaction,token
 */
import pg from "pg";
import { migrate } from "../src/migrate/migrator.js";
import { createPublisher } from "../src/produce/publisher.js";
import { outboxNames } from "../src/sql/names.js";
import { createWorker, type Worker } from "../src/worker/worker.js";
import { arg, DATABASE_URL, fmt, machine, percentile, sleep, until } from "./lib.js";

const messages = Number(arg("messages", "200"));
const keys = Number(arg("keys", "20"));
const hold = Number(arg("hold", "4000"));
const modes = arg("modes", "transaction,token").split(",") as ("transaction" | "token")[];
const schema = "bench_cancel_race";
const names = outboxNames(schema);
const pool = new pg.Pool({ connectionString: DATABASE_URL, max: 40 });
const outbox = createPublisher({ schema, notify: { cooldownMs: 0 } });

async function inTransaction<T>(fn: (c: pg.PoolClient) => Promise<T>): Promise<T> {
  const c = await pool.connect();
  try {
    await c.query("BEGIN");
    const result = await fn(c);
    await c.query("COMMIT");
    return result;
  } catch (error) {
    await c.query("ROLLBACK").catch(() => {});
    throw error;
  } finally {
    c.release();
  }
}

function start(mode: "transaction" | "token", handler: (id: string) => Promise<void>): Promise<Worker> {
  const worker = createWorker({
    connection: DATABASE_URL,
    schema,
    logger: false,
    leaseMode: mode,
    concurrency: 8,
    batchSize: 20,
    minPollIntervalMs: 20,
    maxPollIntervalMs: 200,
    queues: { jobs: (_p, msg) => handler(msg.id) },
  });
  return worker.start().then(() => worker);
}

async function race(mode: "transaction" | "token") {
  await pool.query(`TRUNCATE ${names.messages}, ${names.deadLetters}`);
  const ids = new Map<string, string>();
  await inTransaction(async (c) => {
    for (let i = 0; i < messages; i++) {
      const { id } = await outbox.publish(c, "jobs", { i }, { key: `k${i % keys}`, dedupeKey: `d${i}` });
      ids.set(`d${i}`, id);
    }
  });
  const ran = new Map<string, number>();
  const worker = await start(mode, async (id) => {
    await sleep(2 + Math.random() * 8);
    ran.set(id, (ran.get(id) ?? 0) + 1);
  });
  const answers: { status: string; id?: string; ms: number; error?: string }[] = [];
  const spread = (messages / keys) * 60;
  await Promise.all(
    [...ids.keys()].map(async (dedupeKey) => {
      await sleep(Math.random() * spread);
      // Timed from the cancel's statement (not the wait for a pooled connection) to the commit.
      let t = 0;
      try {
        const r = await inTransaction((c) => {
          t = performance.now();
          return outbox.cancel(c, "jobs", dedupeKey);
        });
        answers.push({ ...r, ms: performance.now() - t });
      } catch (error) {
        answers.push({ status: "error", ms: performance.now() - t, error: String(error) });
      }
    }),
  );
  await until(
    async () => Number((await pool.query(`SELECT count(*) AS n FROM ${names.messages}`)).rows[0].n) === 0,
    120_000,
    20,
  );
  await worker.stop({ timeoutMs: 5000 });
  const ms = answers.map((a) => a.ms);
  const by = (s: string) => answers.filter((a) => a.status === s).length;
  const wrong = answers.filter((a) => a.status === "cancelled" && a.id && ran.has(a.id)).length;
  const twice = [...ran.values()].filter((n) => n > 1).length;
  console.log(
    `${mode}: ${messages} cancels: cancelled ${by("cancelled")}, delivering ${by("delivering")}, not_found ${by("not_found")}, errors ${by("error")};` +
      ` cancelled after their handler ran: ${wrong}; ran twice: ${twice};` +
      ` cancel ms p50 ${fmt(percentile(ms, 50), 1)}, p99 ${fmt(percentile(ms, 99), 1)}, max ${fmt(Math.max(...ms), 1)}`,
  );
  for (const a of answers.filter((x) => x.error).slice(0, 3)) console.log(`  error: ${a.error}`);
}

async function blocked(mode: "transaction" | "token") {
  await pool.query(`TRUNCATE ${names.messages}, ${names.deadLetters}`);
  const { id } = await inTransaction((c) => outbox.publish(c, "jobs", {}, { key: "h", dedupeKey: "held" }));
  let running!: () => void;
  const started = new Promise<void>((resolve) => {
    running = resolve;
  });
  const worker = await start(mode, async () => {
    running();
    await sleep(hold);
  });
  await started;
  const t = performance.now();
  const r = await inTransaction((c) => outbox.cancel(c, "jobs", "held"));
  console.log(
    `${mode}: cancel of ${id} while its ${hold} ms handler runs: ${JSON.stringify(r)} after ${fmt(performance.now() - t, 1)} ms`,
  );
  await worker.stop({ timeoutMs: hold + 5000 });
}

await pool.query(`DROP SCHEMA IF EXISTS ${names.quotedSchema} CASCADE`);
await migrate({ connection: DATABASE_URL, schema });
console.log(await machine(pool));
for (const mode of modes) {
  await race(mode);
  await blocked(mode);
}
await pool.query(`DROP SCHEMA IF EXISTS ${names.quotedSchema} CASCADE`);
await pool.end();
