/**
 * Drain: N rows (about 100-byte payloads) inserted up front, one worker, no-op handler; time until every
 * row is acknowledged. Median and range of several runs per concurrency and payload mode: "parsed" (a plain
 * handler: the payload is JSON-parsed for it, the default) and "raw" (a `rawPayload: true` queue, as every
 * built-in relay is: the stored text, no parse), interleaved run by run. CPU is this process's (the worker's)
 * per message during the drain.
 *
 *   npm run bench:drain -- --rows 50000 --runs 3 --concurrency 10,32 --payload parsed,raw
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
const payloadModes = arg("payload", "parsed,raw").split(",") as ("parsed" | "raw")[];
for (const mode of payloadModes) {
  if (mode !== "parsed" && mode !== "raw") throw new Error(`--payload: parsed or raw, got ${mode}`);
}
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

async function drainOnce(
  concurrency: number,
  mode: "parsed" | "raw",
): Promise<{ rate: number; cpuUs: number }> {
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
    queues: { drain: mode === "raw" ? { handler: () => {}, rawPayload: true } : () => {} },
  });
  worker.on("acked", () => {
    if (++acked === rows) finish();
  });
  const started = performance.now();
  const cpu = process.cpuUsage();
  await worker.start();
  await done;
  const seconds = (performance.now() - started) / 1000;
  const used = process.cpuUsage(cpu);
  await worker.stop();
  const left = (await pool.query(`SELECT count(*)::int AS n FROM ${names.messages}`)).rows[0].n;
  if (left !== 0) throw new Error(`${left} rows left after the drain`);
  return { rate: rows / seconds, cpuUs: (used.user + used.system) / rows };
}

console.log(`# drain: ${rows} rows, batch ${batchSize}, ${runs} runs; ${await machine(pool)}\n`);
console.log("| concurrency | payload | rows/s (median) | range | worker CPU µs/msg (median) |");
console.log("|---:|---|---:|---:|---:|");
for (const c of concurrencies) {
  const results = new Map(payloadModes.map((m) => [m, [] as { rate: number; cpuUs: number }[]]));
  // Modes alternate within each run, so drift of a shared machine hits them alike.
  for (let r = 0; r < runs; r++) for (const m of payloadModes) results.get(m)?.push(await drainOnce(c, m));
  for (const [m, xs] of results) {
    const rates = xs.map((x) => x.rate);
    const cpu = median(xs.map((x) => x.cpuUs)).toFixed(1);
    console.log(`| ${c} | ${m} | ${median(rates).toFixed(0)} | ${range(rates)} | ${cpu} |`);
  }
}
await pool.query(`DROP SCHEMA ${names.quotedSchema} CASCADE`);
await pool.end();
