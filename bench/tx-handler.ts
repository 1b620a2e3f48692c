/**
 * What a handler that commits with its ack costs the drain. N messages (about 100-byte payloads) inserted up
 * front, one worker; each handler inserts one effect row. Modes, interleaved run by run so drift of a
 * shared machine hits them alike:
 *
 * - `batched`: today's path: the handler writes its effect row through a pool of its own (its own
 *   autocommit transaction), and the worker acks in batches (one DELETE per up to 1000 acks).
 * - `transaction`: `handleInTransaction`: the handler writes through `message.transaction`, and its ack
 *   runs in that transaction (one BEGIN … INSERT, DELETE … COMMIT per message, on a held connection).
 * - `keyed-batched` / `keyed-transaction`: the same with a key per message (the keyed ack and promotion).
 *
 * Reports messages/s (median of the runs) and each transactional mode's ratio to its batched one.
 *
 *   node --import tsx bench/tx-handler.ts --rows 20000 --runs 3 --concurrency 10
 *   node --import tsx bench/tx-handler.ts --quick        (2,000 rows, 1 run: proves it works, no figures)
 *   (--json prints the results as one JSON line instead of the table: bench/run.ts reads that.)
 */
import pg from "pg";
import { migrate } from "../src/migrate/migrator.js";
import { outboxNames } from "../src/sql/names.js";
import { handleInTransaction } from "../src/worker/options.js";
import { createWorker } from "../src/worker/worker.js";
import { arg, DATABASE_URL, machine, median, range } from "./lib.js";

export const TX_HANDLER_MODES = ["batched", "transaction", "keyed-batched", "keyed-transaction"] as const;
export type TxHandlerMode = (typeof TX_HANDLER_MODES)[number];

/** One mode's runs: messages acknowledged per second. */
export interface TxHandlerResult {
  mode: TxHandlerMode;
  rates: number[];
}

const quick = process.argv.includes("--quick");
const rows = Number(arg("rows", quick ? "2000" : "20000"));
const runs = Number(arg("runs", quick ? "1" : "3"));
const concurrency = Number(arg("concurrency", "10"));
const modes = arg("modes", TX_HANDLER_MODES.join(",")).split(",") as TxHandlerMode[];
const json = process.argv.includes("--json");
for (const mode of modes) {
  if (!TX_HANDLER_MODES.includes(mode))
    throw new Error(`--modes: one of ${TX_HANDLER_MODES.join(", ")}, got ${mode}`);
}
const schema = "bench_tx_handler";
const names = outboxNames(schema);
const effects = `${names.quotedSchema}.effects`;
const log = (line: string) => {
  if (!json) console.log(line);
};

const pool = new pg.Pool({ connectionString: DATABASE_URL, max: 4 });
await pool.query(`DROP SCHEMA IF EXISTS ${names.quotedSchema} CASCADE`);
await migrate({ connection: DATABASE_URL, schema });
await pool.query(`CREATE TABLE ${effects} (message_id bigint, order_id int)`);
// The batched mode's handlers write through this pool, as an ordinary handler writes through the app's.
const appPool = new pg.Pool({ connectionString: DATABASE_URL, max: concurrency });

const FILL_CHUNK = 2000;

async function fill(keyed: boolean): Promise<void> {
  await pool.query(`TRUNCATE ${names.messages}, ${effects}`);
  // In chunks: the key-head trigger takes each new key's advisory lock until commit.
  for (let from = 1; from <= rows; from += FILL_CHUNK) {
    await pool.query(
      `INSERT INTO ${names.messages} (queue, payload, key)
       SELECT 'work', jsonb_build_object('orderId', g, 'customer', 'customer-' || (g % 97), 'note', repeat('x', 48)),
              CASE WHEN $3 THEN 'k-' || g END
       FROM generate_series($1::int, $2::int) AS g`,
      [from, Math.min(rows, from + FILL_CHUNK - 1), keyed],
    );
  }
  await pool.query(`VACUUM ANALYZE ${names.messages}`);
}

async function drainOnce(mode: TxHandlerMode): Promise<number> {
  await fill(mode.startsWith("keyed"));
  let acked = 0;
  let finish!: () => void;
  const done = new Promise<void>((resolve) => {
    finish = resolve;
  });
  const insert = `INSERT INTO ${effects} (message_id, order_id) VALUES ($1, $2)`;
  const worker = createWorker({
    connection: DATABASE_URL,
    schema,
    concurrency,
    logger: false,
    queues: {
      work: mode.endsWith("transaction")
        ? handleInTransaction<{ orderId: number }>(async (p, message) => {
            await message.transaction.query(insert, [message.id, p.orderId]);
          })
        : async (p: unknown, message) => {
            await appPool.query(insert, [message.id, (p as { orderId: number }).orderId]);
          },
    },
  });
  worker.on("acked", () => {
    if (++acked === rows) finish();
  });
  const started = performance.now();
  await worker.start();
  await done;
  const seconds = (performance.now() - started) / 1000;
  await worker.stop();
  const { rows: left } = await pool.query(
    `SELECT (SELECT count(*)::int FROM ${names.messages}) AS messages, (SELECT count(*)::int FROM ${effects}) AS effects`,
  );
  if (left[0].messages !== 0 || left[0].effects !== rows)
    throw new Error(`${mode}: ${JSON.stringify(left[0])}, expected 0 messages and ${rows} effects`);
  return rows / seconds;
}

log(
  `# handlers that commit with their ack: ${rows} messages, concurrency ${concurrency}, ${runs} runs; ${await machine(pool)}\n`,
);
const results = new Map(modes.map((m) => [m, { mode: m, rates: [] } as TxHandlerResult]));
for (let r = 0; r < runs; r++) {
  for (const m of modes) results.get(m)?.rates.push(await drainOnce(m));
}
if (json) {
  console.log(JSON.stringify([...results.values()]));
} else {
  log("| mode | messages/s (median) | range | vs batched |");
  log("|---|---:|---:|---:|");
  for (const x of results.values()) {
    const base = results.get(x.mode.startsWith("keyed") ? "keyed-batched" : "batched");
    const ratio = base && base !== x ? (median(x.rates) / median(base.rates)).toFixed(2) : "1.00";
    log(`| ${x.mode} | ${median(x.rates).toFixed(0)} | ${range(x.rates)} | ${ratio} |`);
  }
}
await pool.query(`DROP SCHEMA ${names.quotedSchema} CASCADE`);
await pool.end();
await appPool.end();
