/**
 * Pickup latency: an idle worker; a producer commits single-row publish transactions at a steady rate;
 * the time from COMMIT returning to the handler starting, in one process (one clock). With wake-ups on,
 * and poll-only.
 *
 *   npm run bench:latency -- --rate 200 --seconds 10 --runs 3
 */
import pg from "pg";
import { migrate } from "../src/migrate/migrator.js";
import { createPublisher } from "../src/produce/publisher.js";
import { outboxNames } from "../src/sql/names.js";
import { createWorker } from "../src/worker/worker.js";
import { arg, DATABASE_URL, machine, median, percentile, range } from "./lib.js";

const rate = Number(arg("rate", "200"));
const seconds = Number(arg("seconds", "10"));
const runs = Number(arg("runs", "3"));
const schema = "bench_latency";
const names = outboxNames(schema);

const pool = new pg.Pool({ connectionString: DATABASE_URL, max: 8 });
await pool.query(`DROP SCHEMA IF EXISTS ${names.quotedSchema} CASCADE`);
await migrate({ connection: DATABASE_URL, schema });

interface Figures {
  p50: number;
  p95: number;
  p99: number;
  max: number;
}

async function measure(listen: boolean): Promise<Figures> {
  await pool.query(`TRUNCATE ${names.messages}`);
  const committedAt = new Map<string, number>();
  const latencies: number[] = [];
  const early = new Map<string, number>();
  const worker = createWorker({
    connection: DATABASE_URL,
    schema,
    listen,
    logger: false,
    queues: {
      lat: (_p, m) => {
        const now = performance.now();
        const at = committedAt.get(m.id);
        // The handler can start before the producer's COMMIT call has returned to it.
        if (at === undefined) early.set(m.id, now);
        else latencies.push(now - at);
      },
    },
  });
  await worker.start();
  await new Promise((r) => setTimeout(r, 500));
  const outbox = createPublisher({ schema, notify: { connection: pool } });
  const total = rate * seconds;
  const interval = 1000 / rate;
  const t0 = performance.now();
  const inflight: Promise<void>[] = [];
  for (let i = 0; i < total; i++) {
    const due = t0 + i * interval;
    const wait = due - performance.now();
    if (wait > 0) await new Promise((r) => setTimeout(r, wait));
    inflight.push(
      (async () => {
        const client = await pool.connect();
        try {
          await client.query("BEGIN");
          const id = await outbox.publish(client, "lat", { i });
          await client.query("COMMIT");
          const now = performance.now();
          committedAt.set(id, now);
          const started = early.get(id);
          if (started !== undefined) latencies.push(Math.max(0, started - now));
        } finally {
          client.release();
        }
      })(),
    );
  }
  await Promise.all(inflight);
  const deadline = performance.now() + 10_000;
  while (latencies.length < total && performance.now() < deadline)
    await new Promise((r) => setTimeout(r, 20));
  await worker.stop();
  if (latencies.length < total) throw new Error(`only ${latencies.length} of ${total} rows were picked up`);
  return {
    p50: percentile(latencies, 50),
    p95: percentile(latencies, 95),
    p99: percentile(latencies, 99),
    max: Math.max(...latencies),
  };
}

console.log(`# pickup latency: ${rate} tx/s for ${seconds} s, ${runs} runs; ${await machine(pool)}\n`);
console.log("| mode | p50 ms | p95 ms | p99 ms | max ms | p99 range |");
console.log("|---|---:|---:|---:|---:|---:|");
for (const [label, listen] of [
  ["LISTEN/NOTIFY wake-ups", true],
  ["poll only (100–2000 ms)", false],
] as const) {
  const all: Figures[] = [];
  for (let r = 0; r < runs; r++) all.push(await measure(listen));
  const m = (k: keyof Figures) => median(all.map((f) => f[k])).toFixed(1);
  console.log(
    `| ${label} | ${m("p50")} | ${m("p95")} | ${m("p99")} | ${m("max")} | ${range(
      all.map((f) => f.p99),
      1,
    )} |`,
  );
}
await pool.query(`DROP SCHEMA ${names.quotedSchema} CASCADE`);
await pool.end();
