/**
 * Replicas: one backlog drained by 1, 2 and 4 worker processes (each a `createWorker` with default options
 * and a no-op handler, as a replica of `outbox-worker run` would be), runs interleaved (1, 2, 4, 1, 2, 4, …).
 * Reports rows/s (median and range), where the CPU went (the worker processes vs the Postgres server's
 * processes, from process.cpuUsage() of each child and /proc/<pid>/stat of every `postgres` process) and the
 * most connections the workers held at once (pg_stat_activity, by application_name: pools and LISTEN).
 *
 *   npx tsx bench/replicas.ts [--rows 100000] [--runs 3] [--replicas 1,2,4]
 *
 * Needs an idle machine (the figures are CPU-bound) and a local Postgres (the server's CPU is read from /proc).
 */
import { fork } from "node:child_process";
import { readdirSync, readFileSync } from "node:fs";
import os from "node:os";
import { fileURLToPath } from "node:url";
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
  range,
  sleep,
} from "./lib.js";
import { adminPool, dropSchema, QUEUE, vacuumSchema } from "./peers/peer.js";

const SCHEMA = "bench_replicas";
const names = outboxNames(SCHEMA);

type ToChild = { cmd: "go" } | { cmd: "stop" };
type FromChild = { msg: "loaded" } | { msg: "started" } | { msg: "stopped"; cpuS: number };

/** A child: builds its worker, waits for "go", starts it; on "stop", stops it and reports its CPU time. */
async function child(id: string): Promise<void> {
  const send = (m: FromChild) => process.send?.(m);
  const worker = createWorker({
    connection: DATABASE_URL,
    schema: SCHEMA,
    workerId: `bench-replica-${id}`,
    logger: false,
    queues: { [QUEUE]: async () => {} },
  });
  let cpu0 = process.cpuUsage();
  process.on("message", async (m: ToChild) => {
    if (m.cmd === "go") {
      cpu0 = process.cpuUsage();
      await worker.start();
      send({ msg: "started" });
    } else {
      const d = process.cpuUsage(cpu0);
      await worker.stop({ timeoutMs: 10_000 });
      // Exit once the report is on its way (a handle left open must not keep a replica alive).
      process.send?.({ msg: "stopped", cpuS: (d.user + d.system) / 1e6 } satisfies FromChild, () =>
        process.exit(0),
      );
    }
  });
  send({ msg: "loaded" });
}

/** CPU seconds of every process named `postgres` (the server, its backends and helpers), from /proc. */
function postgresCpuSeconds(): number {
  const tick = 100; // USER_HZ
  let total = 0;
  for (const pid of readdirSync("/proc").filter((p) => /^\d+$/.test(p))) {
    try {
      const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
      const close = stat.lastIndexOf(")");
      if (stat.slice(stat.indexOf("(") + 1, close) !== "postgres") continue;
      const fields = stat.slice(close + 2).split(" ");
      total += (Number(fields[11]) + Number(fields[12])) / tick; // utime, stime (fields 14, 15)
    } catch {
      // gone meanwhile
    }
  }
  return total;
}

interface RunResult {
  replicas: number;
  rowsPerS: number;
  seconds: number;
  workersCpuS: number;
  postgresCpuS: number;
  machineCpuS: number;
  maxConnections: number;
}

async function run(replicas: number, rows: number): Promise<RunResult> {
  const admin = adminPool();
  try {
    await dropSchema(admin, SCHEMA);
    await migrate({ connection: DATABASE_URL, schema: SCHEMA });
    const script = fileURLToPath(import.meta.url);
    const children = Array.from({ length: replicas }, (_, i) =>
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
        c.once("exit", (code) => reject(new Error(`replica exited ${code} waiting for ${want}`)));
      });
    await Promise.all(children.map((c) => next(c, "loaded")));

    // The backlog, keyless, as bench/peers/outbox.ts fills it.
    await admin.query(
      `INSERT INTO ${names.messages} (queue, payload) SELECT '${QUEUE}', ${PAYLOAD_SQL} FROM generate_series(1, $1) AS g`,
      [rows],
    );
    await vacuumSchema(admin, SCHEMA);

    const pg0 = postgresCpuSeconds();
    const all0 = machineCpuSeconds();
    const t0 = performance.now();
    for (const c of children) c.send({ cmd: "go" } satisfies ToChild);
    let maxConnections = 0;
    for (;;) {
      const r = await admin.query<{ left: number; conns: number }>(
        `SELECT (SELECT count(*)::int FROM ${names.messages}) AS left,
                (SELECT count(*)::int FROM pg_stat_activity
                 WHERE application_name LIKE 'outbox-worker bench-replica-%'
                    OR application_name LIKE 'outbox-listen bench-replica-%') AS conns`,
      );
      maxConnections = Math.max(maxConnections, r.rows[0]?.conns ?? 0);
      if (r.rows[0]?.left === 0) break;
      await sleep(20);
    }
    const seconds = (performance.now() - t0) / 1000;
    const postgresCpuS = postgresCpuSeconds() - pg0;
    const machineCpuS = machineCpuSeconds() - all0;
    const stopped = children.map((c) => next(c, "stopped"));
    for (const c of children) c.send({ cmd: "stop" } satisfies ToChild);
    const cpu = (await Promise.all(stopped)).map((m) => (m.msg === "stopped" ? m.cpuS : 0));
    await Promise.all(
      children.map((c) => new Promise((resolve) => c.exitCode !== null || c.once("exit", resolve))),
    );
    await dropSchema(admin, SCHEMA);
    return {
      replicas,
      rowsPerS: rows / seconds,
      seconds,
      workersCpuS: cpu.reduce((a, b) => a + b, 0),
      postgresCpuS,
      machineCpuS,
      maxConnections,
    };
  } finally {
    await admin.end();
  }
}

async function main(): Promise<void> {
  const rows = Number(arg("rows", "100000"));
  const runs = Number(arg("runs", "3"));
  const counts = arg("replicas", "1,2,4").split(",").map(Number);
  const admin = adminPool();
  console.log(
    `machine: ${await machine(admin)}; load ${os
      .loadavg()
      .map((l) => l.toFixed(2))
      .join(" ")}`,
  );
  await admin.end();
  const results: RunResult[] = [];
  for (let r = 1; r <= runs; r++) {
    for (const n of counts) {
      const res = await run(n, rows);
      results.push(res);
      console.log(
        `run ${r}, ${n} replica(s): ${fmt(res.rowsPerS)} rows/s (${res.seconds.toFixed(2)} s); CPU s: workers ${res.workersCpuS.toFixed(2)}, postgres ${res.postgresCpuS.toFixed(2)}, machine ${res.machineCpuS.toFixed(2)}; connections ${res.maxConnections}`,
      );
    }
  }
  const cores = os.availableParallelism();
  console.log(
    `\n${fmt(rows)} rows, ${runs} runs each, interleaved; ${cores} cores. CPU shares are of the drain's wall time × cores.\n`,
  );
  console.log(
    "| replicas | rows/s, median (range) | vs 1 | workers' CPU, cores | Postgres CPU, cores | machine busy | µs CPU/row, workers | µs CPU/row, Postgres | connections (max) |",
  );
  console.log("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
  const base = median(results.filter((r) => r.replicas === counts[0]).map((r) => r.rowsPerS));
  for (const n of counts) {
    const rs = results.filter((r) => r.replicas === n);
    const m = (f: (r: RunResult) => number) => median(rs.map(f));
    console.log(
      `| ${n} | ${fmt(m((r) => r.rowsPerS))} (${range(rs.map((r) => r.rowsPerS))}) | ${(m((r) => r.rowsPerS) / base).toFixed(2)}× | ${m((r) => r.workersCpuS / r.seconds).toFixed(2)} | ${m((r) => r.postgresCpuS / r.seconds).toFixed(2)} | ${fmt(m((r) => (100 * r.machineCpuS) / (r.seconds * cores)))} % | ${fmt(m((r) => (1e6 * r.workersCpuS) / rows))} | ${fmt(m((r) => (1e6 * r.postgresCpuS) / rows))} | ${m((r) => r.maxConnections)} |`,
    );
  }
}

const childAt = process.argv.indexOf("--child");
if (childAt >= 0) await child(process.argv[childAt + 1] ?? "1");
else await main();
