/**
 * Drains an existing backlog with the COMPILED package (dist/, `npm run build`) under plain node, no tsx
 * loader: the worker's RSS as it would be in production. Spawned by bench/job.ts (scale), which filled the
 * schema. Prints one `BENCH_RESULT {json}` line.
 *
 *   node bench/drain-compiled.mjs '{"url":"postgres://…","schema":"bench_scale","rows":1000000,"concurrency":10,"batchSize":500}'
 */
import { createRequire } from "node:module";
import { createWorker } from "../dist/index.js";

const spec = JSON.parse(process.argv[2] ?? "{}");
const pg = createRequire(new URL("../package.json", import.meta.url))("pg");

// Count every statement, and time the worker's lease and ack statements (as bench/lib.ts does).
let statements = 0;
const timings = { lease: [], ack: [] };
const original = pg.Client.prototype.query;
pg.Client.prototype.query = function (...args) {
  statements++;
  const label = /^outbox_(lease|ack)_/.exec(args[0]?.name ?? "")?.[1];
  const last = args.length - 1;
  if (label && typeof args[last] === "function") {
    const started = performance.now();
    const callback = args[last];
    args[last] = (...cbArgs) => {
      timings[label].push(performance.now() - started);
      return callback(...cbArgs);
    };
  }
  return original.apply(this, args);
};

const percentile = (xs, p) => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1))] ?? Number.NaN;
};
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const MB = 2 ** 20;

const rows = spec.rows;
const tenth = Math.floor(rows / 10);
const marks = new Map();
const counts = new Map();
let handled = 0;
const rssIdle = process.memoryUsage().rss;
const samples = [rssIdle];
const sampler = setInterval(() => samples.push(process.memoryUsage().rss), 100);
const worker = createWorker({
  connection: spec.url,
  schema: spec.schema,
  concurrency: spec.concurrency,
  batchSize: spec.batchSize,
  ...(spec.preparedStatements === false ? { preparedStatements: false } : {}),
  logger: false,
  queues: {
    bench: () => {
      handled++;
      if (handled === 1 || handled === tenth || handled === rows - tenth || handled === rows) {
        marks.set(handled, performance.now());
        counts.set(handled, statements);
      }
    },
  },
});
await worker.start();
for (const deadline = performance.now() + 900_000; handled < rows; await sleep(5)) {
  if (performance.now() > deadline) throw new Error(`only ${handled} of ${rows} handled`);
}
const admin = new pg.Client({ connectionString: spec.url });
await admin.connect();
for (const deadline = performance.now() + 60_000; ; await sleep(2)) {
  const { rows: r } = await admin.query(`SELECT count(*)::int AS n FROM "${spec.schema}".messages`);
  if (r[0].n === 0) break;
  if (performance.now() > deadline) throw new Error(`${r[0].n} rows left`);
}
const end = performance.now();
clearInterval(sampler);
samples.push(process.memoryUsage().rss);
await worker.stop();
await admin.end();
const at = (n) => marks.get(n) ?? Number.NaN;
samples.sort((a, b) => a - b);
const result = {
  rssMaxMb: samples[samples.length - 1] / MB,
  rssMedianMb: samples[samples.length >> 1] / MB,
  rssIdleMb: rssIdle / MB,
  startRate: (tenth - 1) / ((at(tenth) - at(1)) / 1000),
  endRate: tenth / ((at(rows) - at(rows - tenth)) / 1000),
  rate: rows / ((end - at(1)) / 1000),
  roundTrips: ((counts.get(rows - tenth) ?? 0) - (counts.get(tenth) ?? 0)) / (rows - 2 * tenth),
  workerFetch: { p50: percentile(timings.lease, 50), p99: percentile(timings.lease, 99) },
  workerAck: { p50: percentile(timings.ack, 50), p99: percentile(timings.ack, 99) },
};
process.stdout.write(`BENCH_RESULT ${JSON.stringify(result)}\n`);
process.exit(0);
