/**
 * Drain: N rows (about 100-byte payloads) inserted up front, one worker, no-op handler; time until every
 * row is acknowledged. Median and range of several runs per concurrency.
 *
 *   npm run bench:drain -- --rows 50000 --runs 3 --concurrency 10,32
 */
import pg from "pg";
import { migrate } from "../src/migrate/migrator.js";
import { outboxNames } from "../src/sql/names.js";
import { createWorker } from "../src/worker/worker.js";
import { arg, DATABASE_URL, machine, median, range } from "./lib.js";

const rows = Number(arg("rows", "50000"));
const runs = Number(arg("runs", "3"));
const concurrencies = arg("concurrency", "10,32").split(",").map(Number);
const batchSize = Number(arg("batch", "500"));
const schema = "bench_drain";
const names = outboxNames(schema);

const pool = new pg.Pool({ connectionString: DATABASE_URL, max: 4 });
await pool.query(`DROP SCHEMA IF EXISTS ${names.quotedSchema} CASCADE`);
await migrate({ connection: DATABASE_URL, schema });

async function fill(): Promise<void> {
  await pool.query(`TRUNCATE ${names.messages}`);
  await pool.query(
    `INSERT INTO ${names.messages} (queue, payload)
     SELECT 'drain', jsonb_build_object('orderId', g, 'customer', 'customer-' || (g % 97), 'note', repeat('x', 48))
     FROM generate_series(1, $1) AS g`,
    [rows],
  );
  await pool.query(`VACUUM ANALYZE ${names.messages}`);
}

async function drainOnce(concurrency: number): Promise<number> {
  await fill();
  let acked = 0;
  let finish!: () => void;
  const done = new Promise<void>((resolve) => {
    finish = resolve;
  });
  const worker = createWorker({
    connection: DATABASE_URL,
    schema,
    concurrency,
    batchSize,
    logger: false,
    queues: { drain: () => {} },
  });
  worker.on("acked", () => {
    if (++acked === rows) finish();
  });
  const started = performance.now();
  await worker.start();
  await done;
  const seconds = (performance.now() - started) / 1000;
  await worker.stop();
  const left = (await pool.query(`SELECT count(*)::int AS n FROM ${names.messages}`)).rows[0].n;
  if (left !== 0) throw new Error(`${left} rows left after the drain`);
  return rows / seconds;
}

console.log(`# drain: ${rows} rows, batch ${batchSize}, ${runs} runs; ${await machine(pool)}\n`);
console.log("| concurrency | rows/s (median) | range |");
console.log("|---:|---:|---:|");
for (const c of concurrencies) {
  const rates: number[] = [];
  for (let r = 0; r < runs; r++) rates.push(await drainOnce(c));
  console.log(`| ${c} | ${median(rates).toFixed(0)} | ${range(rates)} |`);
}
await pool.query(`DROP SCHEMA ${names.quotedSchema} CASCADE`);
await pool.end();
