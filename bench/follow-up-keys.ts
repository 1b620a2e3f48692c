/**
 * Ack latency of parents whose follow-ups are keyed on a few shared keys, with two workers (issue 26.5).
 * N parent rows (about 100-byte payloads) inserted up front; each worker a child process running
 * `createWorker` (concurrency 10, default options); each handler returns one follow-up to a queue no worker
 * serves. Ack latency: from the handler's return to the worker's `acked` event for that parent (the
 * completer's batching, the ack's round trips, and any pause while a follow-up key was busy). Modes,
 * interleaved run by run:
 *
 * - `keyless`: the follow-ups have no key (the baseline: one statement per ack batch).
 * - `keyed`: follow-up n has key `k<n % keys>`: every batch of either worker takes locks on those keys.
 * - `keyed-1w`: the same with one worker.
 * - `keyed-parents`: as `keyed`, and each parent has a key of its own (the keyed ack path).
 *
 *   node --import tsx bench/follow-up-keys.ts --rows 20000 --keys 50 --runs 5 [--modes keyed,keyed-1w]
 *   (each run first waits up to --idle-wait seconds, 180 by default, for an idle machine)
 *   (--json prints the results as one JSON line instead of the table: bench/run.ts reads that.)
 */
import { fork } from "node:child_process";
import { fileURLToPath } from "node:url";
import pino from "pino";
import { followUp } from "../src/contract/follow-up.js";
import { migrate } from "../src/migrate/migrator.js";
import { outboxNames } from "../src/sql/names.js";
import { createWorker } from "../src/worker/worker.js";
import {
  arg,
  DATABASE_URL,
  fmt,
  machine,
  machineCpuSeconds,
  median,
  PAYLOAD_SQL,
  percentile,
  range,
  sleep,
} from "./lib.js";
import { adminPool, dropSchema, vacuumSchema } from "./peers/peer.js";

export const FOLLOW_UP_KEY_MODES = ["keyless", "keyed", "keyed-1w", "keyed-parents"] as const;
export type FollowUpKeyMode = (typeof FOLLOW_UP_KEY_MODES)[number];

/** One mode's runs: each run's ack latency percentiles (ms), parents/s, and busy answers per parent. */
export interface FollowUpKeyResult {
  mode: FollowUpKeyMode;
  p50: number[];
  p99: number[];
  max: number[];
  rates: number[];
  busy: number[];
}

const SCHEMA = "bench_follow_up_keys";
const names = outboxNames(SCHEMA);

type ToChild = { cmd: "go"; keys: number; keyed: boolean } | { cmd: "stop" };
type FromChild = { msg: "loaded" } | { msg: "stopped"; latencies: number[]; busy: number };

/** A worker process: on "go" it serves `parent`; on "stop" it stops and sends each parent's ack latency. */
async function child(id: string): Promise<void> {
  const send = (m: FromChild, then: () => void = () => {}) => process.send?.(m, then);
  const returned = new Map<string, number>();
  const latencies: number[] = [];
  // Deliveries answered busy (a key lock held elsewhere), counted from the worker's debug line for them.
  let busy = 0;
  const logger = pino(
    { level: "debug" },
    {
      write(line: string) {
        const entry = JSON.parse(line) as { msg?: string; heads?: number };
        if (entry.msg?.startsWith("key heads kept in place")) busy += entry.heads ?? 0;
      },
    },
  );
  let worker: ReturnType<typeof createWorker> | undefined;
  process.on("message", async (m: ToChild) => {
    if (m.cmd === "go") {
      worker = createWorker({
        connection: DATABASE_URL,
        schema: SCHEMA,
        workerId: `bench-fuk-${id}`,
        concurrency: 10,
        logger,
        queues: {
          parent: (payload: unknown, message) => {
            const n = (payload as { orderId: number }).orderId;
            returned.set(message.id, performance.now());
            return followUp("child", { parent: n }, m.keyed ? { key: `k${n % m.keys}` } : {});
          },
        },
      });
      worker.on("acked", ({ id }) => {
        const at = returned.get(id);
        if (at === undefined) return;
        returned.delete(id);
        latencies.push(performance.now() - at);
      });
      await worker.start();
    } else {
      await worker?.stop({ timeoutMs: 10_000 });
      // Exit once the report is on its way (a handle left open must not keep the child alive).
      send({ msg: "stopped", latencies, busy }, () => process.exit(0));
    }
  });
  send({ msg: "loaded" });
}

async function runOnce(mode: FollowUpKeyMode, rows: number, keys: number) {
  const admin = adminPool();
  try {
    await dropSchema(admin, SCHEMA);
    await migrate({ connection: DATABASE_URL, schema: SCHEMA });
    const script = fileURLToPath(import.meta.url);
    const workers = mode === "keyed-1w" ? 1 : 2;
    const children = Array.from({ length: workers }, (_, i) =>
      fork(script, ["--child", String(i + 1)], { execArgv: ["--import", "tsx"], stdio: "inherit" }),
    );
    const next = (c: (typeof children)[number], want: FromChild["msg"]) =>
      new Promise<FromChild>((resolve, reject) => {
        const onMessage = (m: FromChild) => {
          if (m.msg !== want) return;
          c.off("message", onMessage);
          resolve(m);
        };
        c.on("message", onMessage);
        c.once("exit", (code) => reject(new Error(`worker exited ${code} waiting for ${want}`)));
      });
    await Promise.all(children.map((c) => next(c, "loaded")));
    // In chunks: the key-head trigger takes each new key's lock until commit (max_locks_per_transaction).
    for (let from = 1; from <= rows; from += 2000) {
      await admin.query(
        `INSERT INTO ${names.messages} (queue, payload, key)
         SELECT 'parent', ${PAYLOAD_SQL}, CASE WHEN $3 THEN 'p' || g END FROM generate_series($1::int, $2::int) AS g`,
        [from, Math.min(rows, from + 1999), mode === "keyed-parents"],
      );
    }
    await vacuumSchema(admin, SCHEMA);
    const t0 = performance.now();
    for (const c of children) c.send({ cmd: "go", keys, keyed: mode !== "keyless" } satisfies ToChild);
    for (;;) {
      const r = await admin.query(`SELECT count(*)::int AS n FROM ${names.messages} WHERE queue = 'parent'`);
      if (r.rows[0]?.n === 0) break;
      await sleep(20);
    }
    const seconds = (performance.now() - t0) / 1000;
    const stopped = children.map((c) => next(c, "stopped"));
    for (const c of children) c.send({ cmd: "stop" } satisfies ToChild);
    const reports = (await Promise.all(stopped)).flatMap((m) => (m.msg === "stopped" ? [m] : []));
    const latencies = reports.flatMap((m) => m.latencies);
    const { rows: left } = await admin.query(
      `SELECT count(*)::int AS n FROM ${names.messages} WHERE queue = 'child'`,
    );
    if (left[0]?.n !== rows) throw new Error(`${mode}: ${left[0]?.n} follow-ups, expected ${rows}`);
    // Parents acked once each: a count beyond `rows` is a parent handled twice (an ack that did not land in time).
    if (latencies.length < rows) throw new Error(`${mode}: ${latencies.length} acks seen of ${rows}`);
    await dropSchema(admin, SCHEMA);
    return {
      p50: percentile(latencies, 50),
      p99: percentile(latencies, 99),
      max: Math.max(...latencies),
      rate: rows / seconds,
      busy: reports.reduce((n, m) => n + m.busy, 0) / rows,
    };
  } finally {
    await admin.end();
  }
}

/**
 * Waits (up to `seconds`) until the machine spends under a quarter of a CPU-second a second, as bench/run.ts
 * does before each job: other load (a test suite) would show as latency. Returns the last reading.
 */
async function idle(seconds: number): Promise<number> {
  let busy = 0;
  for (const deadline = Date.now() + seconds * 1000; ; ) {
    const before = machineCpuSeconds();
    await sleep(1000);
    busy = machineCpuSeconds() - before;
    if (busy < 0.25 || Date.now() > deadline) return busy;
    process.stderr.write(`machine busy (${busy.toFixed(2)} CPU-s/s): waiting\n`);
  }
}

async function main(): Promise<void> {
  const rows = Number(arg("rows", "20000"));
  const keys = Number(arg("keys", "50"));
  const runs = Number(arg("runs", "5"));
  const modes = arg("modes", FOLLOW_UP_KEY_MODES.join(",")).split(",") as FollowUpKeyMode[];
  const json = process.argv.includes("--json");
  const idleWait = Number(arg("idle-wait", "180"));
  for (const mode of modes) {
    if (!FOLLOW_UP_KEY_MODES.includes(mode))
      throw new Error(`--modes: one of ${FOLLOW_UP_KEY_MODES.join(", ")}, got ${mode}`);
  }
  const log = (line: string) => {
    if (!json) console.log(line);
  };
  const admin = adminPool();
  log(`# follow-up keys: ${rows} parents, ${keys} keys, ${runs} runs; ${await machine(admin)}\n`);
  await admin.end();
  const results = new Map(
    modes.map((mode) => [
      mode,
      { mode, p50: [], p99: [], max: [], rates: [], busy: [] } as FollowUpKeyResult,
    ]),
  );
  for (let r = 1; r <= runs; r++) {
    for (const mode of modes) {
      const load = await idle(idleWait);
      const x = await runOnce(mode, rows, keys);
      const res = results.get(mode);
      res?.p50.push(x.p50);
      res?.p99.push(x.p99);
      res?.max.push(x.max);
      res?.rates.push(x.rate);
      res?.busy.push(x.busy);
      log(
        `run ${r} ${mode}: ack latency p50 ${x.p50.toFixed(0)} ms, p99 ${x.p99.toFixed(0)} ms, max ${x.max.toFixed(0)} ms; ${fmt(x.rate)} parents/s; ${x.busy.toFixed(2)} busy answers per parent (machine busy ${load.toFixed(2)} CPU-s/s before)`,
      );
    }
  }
  if (json) {
    console.log(JSON.stringify([...results.values()]));
    return;
  }
  log(
    "\n| mode | ack p50 ms, median (range) | ack p99 ms, median (range) | max ms, median (range) | parents/s (median) | busy answers per parent (median) |",
  );
  log("|---|---:|---:|---:|---:|---:|");
  for (const x of results.values()) {
    log(
      `| ${x.mode} | ${fmt(median(x.p50))} (${range(x.p50)}) | ${fmt(median(x.p99))} (${range(x.p99)}) | ${fmt(median(x.max))} (${range(x.max)}) | ${fmt(median(x.rates))} | ${median(x.busy).toFixed(2)} |`,
    );
  }
}

const childAt = process.argv.indexOf("--child");
if (childAt >= 0) await child(process.argv[childAt + 1] ?? "1");
else await main();
