// A worker in its own process for bench/crash-loop.ts (issue 41, item 3). Its handler writes every run to a
// ledger table first (its own pool, before anything else), then: a poison message (payload {poison: true})
// kills the process with SIGKILL, every time it is delivered; any other message sleeps a few ms and is acked.
// DATABASE_URL, OUTBOX_SCHEMA, WORKER_ID, LEASE_MODE and LEASE_TTL_MS come from the parent.
import pg from "pg";
import { createWorker } from "../src/worker/worker.js";

const url = process.env.DATABASE_URL as string;
const schema = process.env.OUTBOX_SCHEMA as string;
const workerId = process.env.WORKER_ID as string;
const ledger = new pg.Pool({ connectionString: url, max: 4 });
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

const worker = createWorker({
  connection: url,
  schema,
  workerId,
  logger: false,
  leaseMode: process.env.LEASE_MODE === "transaction" ? "transaction" : "token",
  leaseTtlMs: Number(process.env.LEASE_TTL_MS ?? 2000),
  maxDeliveries: 5,
  concurrency: 4,
  batchSize: 20,
  minPollIntervalMs: 20,
  maxPollIntervalMs: 200,
  queues: {
    "crash.loop": async (payload, message) => {
      await ledger.query(
        `INSERT INTO "${schema}".ledger (id, worker, deliveries, at) VALUES ($1, $2, $3, clock_timestamp())`,
        [message.id, workerId, message.deliveries],
      );
      if ((payload as { poison?: boolean }).poison === true) process.kill(process.pid, "SIGKILL");
      await sleep(3);
    },
  },
});

worker.on("fatal", (e) => {
  process.stderr.write(`crash-loop-worker ${workerId} fatal: ${String(e.error)}\n`);
  process.exit(1);
});

await worker.start();
process.stdout.write("ready\n");
