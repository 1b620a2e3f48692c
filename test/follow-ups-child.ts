// A worker in its own process, so a test can kill it with SIGKILL between its handler and its ack. Each
// run of the handler is written to a ledger first; the follow-ups it returns go in with the ack.
import pg from "pg";
import { followUp } from "../src/contract/follow-up.js";
import { createWorker } from "../src/worker/worker.js";

const url = process.env.DATABASE_URL as string;
const schema = process.env.OUTBOX_SCHEMA as string;
const ledger = new pg.Pool({ connectionString: url, max: 2 });
const worker = createWorker({
  connection: url,
  schema,
  workerId: process.env.WORKER_ID,
  logger: false,
  leaseTtlMs: 60_000,
  concurrency: 4,
  batchSize: 40,
  queues: {
    // Many parents, killed at a random point mid-batch: each ack carries one follow-up.
    bulk: async (_payload, message) => {
      await ledger.query(`INSERT INTO "${schema}".ledger (id, worker) VALUES ($1, 'child')`, [message.id]);
      await new Promise((resolve) => setTimeout(resolve, 5));
      return followUp("bulk-next", { parent: message.id });
    },
    parent: async (_payload, message) => {
      await ledger.query(`INSERT INTO "${schema}".ledger (id, worker) VALUES ($1, 'child')`, [message.id]);
      // The test's gate: it holds this lock until it has locked the messages table, so the ack below waits.
      await ledger.query("SELECT pg_advisory_xact_lock(4242)");
      message.publish("after", { parent: message.id, form: "context" });
      // Keyed parents publish a keyed follow-up too: the keyed ack and its follow-up insert are one transaction.
      return followUp("after", { parent: message.id, form: "returned" }, message.key ? { key: "held" } : {});
    },
  },
});
await worker.start();
process.stdout.write("ready\n");
