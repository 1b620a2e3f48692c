import { spawn } from "node:child_process";
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import os from "node:os";
import { fileURLToPath } from "node:url";
import type pg from "pg";

export const DATABASE_URL = process.env.DATABASE_URL ?? "postgres://postgres@127.0.0.1:5432/test";
export const ROOT = fileURLToPath(new URL("..", import.meta.url));

export function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  const mid = Math.floor(s.length / 2);
  return s.length % 2 ? (s[mid] ?? 0) : ((s[mid - 1] ?? 0) + (s[mid] ?? 0)) / 2;
}

export function percentile(xs: number[], p: number): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1))] ?? Number.NaN;
}

export function range(xs: number[], digits = 0): string {
  return `${fmt(Math.min(...xs), digits)}–${fmt(Math.max(...xs), digits)}`;
}

/** A number with thousands separators (digits 0) or fixed decimals. */
export function fmt(x: number, digits = 0): string {
  if (!Number.isFinite(x)) return "–";
  return digits === 0 ? Math.round(x).toLocaleString("en-US") : x.toFixed(digits);
}

export async function machine(pool: pg.Pool): Promise<string> {
  const v = (await pool.query("SHOW server_version")).rows[0].server_version;
  return `${os.cpus().length} cores, ${Math.round(os.totalmem() / 2 ** 30)} GiB, PostgreSQL ${v}, Node ${process.version}`;
}

/** `--name value` from argv, else the fallback. */
export function arg(name: string, fallback: string): string {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? (process.argv[i + 1] ?? fallback) : fallback;
}

export const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

/** The same ~100-byte payload for every system: `{"orderId":…,"customer":"customer-…","note":"xxx…"}`. */
export function payload(n: number): { orderId: number; customer: string; note: string } {
  return { orderId: n, customer: `customer-${n % 97}`, note: "x".repeat(48) };
}
/** The same payload built in SQL from `g`, for bulk fills. */
export const PAYLOAD_SQL = `jsonb_build_object('orderId', g, 'customer', 'customer-' || (g % 97), 'note', repeat('x', 48))`;

/** Wait until `check()` is true, polling every `everyMs`; throws after `timeoutMs` (every loop is bounded). */
export async function until(check: () => boolean | Promise<boolean>, timeoutMs: number, everyMs = 2) {
  const deadline = performance.now() + timeoutMs;
  while (!(await check())) {
    if (performance.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms`);
    await sleep(everyMs);
  }
}

/**
 * Counts every statement sent to Postgres by this process: `Client.prototype.query` of each copy of pg
 * (the root's, used by src/, and bench/node_modules' one, used by the peers), so pools, listeners and
 * peers' own clients are all counted. A multi-statement simple query is one round trip, and counts once.
 * Named statements (this project's are `outbox_<label>_<hash>`) are also timed, by label.
 */
export function instrumentQueries(): { readonly count: number; readonly timings: Map<string, number[]> } {
  const stats = { count: 0, timings: new Map<string, number[]>() };
  const seen = new Set<unknown>();
  for (const from of [
    new URL("../package.json", import.meta.url),
    new URL("./package.json", import.meta.url),
  ]) {
    let Client: { prototype: { query: (...args: unknown[]) => unknown } };
    try {
      Client = createRequire(from)("pg").Client;
    } catch {
      continue;
    }
    if (seen.has(Client)) continue;
    seen.add(Client);
    const original = Client.prototype.query;
    Client.prototype.query = function (this: unknown, ...args: unknown[]) {
      stats.count++;
      const name = (args[0] as { name?: unknown } | undefined)?.name;
      if (typeof name !== "string" || !name.startsWith("outbox_")) return original.apply(this, args);
      const label = name.split("_")[1] ?? name;
      const started = performance.now();
      const done = () => {
        const list = stats.timings.get(label) ?? [];
        list.push(performance.now() - started);
        stats.timings.set(label, list);
      };
      // pg-pool passes a callback; direct callers get a promise.
      const last = args.length - 1;
      const callback = args[last];
      if (typeof callback === "function") {
        args[last] = (...cbArgs: unknown[]) => {
          done();
          return callback(...cbArgs);
        };
        return original.apply(this, args);
      }
      const result = original.apply(this, args);
      if (result instanceof Promise) result.then(done, () => {});
      return result;
    };
  }
  return stats;
}

/** Samples this process's RSS every `everyMs` until stopped. */
export function sampleRss(everyMs = 100): { stop(): number[] } {
  const samples: number[] = [process.memoryUsage().rss];
  const timer = setInterval(() => samples.push(process.memoryUsage().rss), everyMs);
  return {
    stop() {
      clearInterval(timer);
      samples.push(process.memoryUsage().rss);
      return samples;
    },
  };
}

/** Marker before the JSON result line a bench job prints on stdout. */
export const RESULT_MARK = "BENCH_RESULT ";

/**
 * Runs one measurement in a fresh Node process (`bench/job.ts` under tsx, or a plain .mjs script), so each
 * worker is alone in its process: its RSS, its statement count and its module state are its own.
 */
export function runJob<T>(
  spec: object,
  /** `cwd`: another checkout of this project to run the job from (its own bench/job.ts and src). */
  options: { timeoutMs?: number; nodeArgs?: string[]; script?: string; cwd?: string } = {},
): Promise<T> {
  const timeoutMs = options.timeoutMs ?? 900_000;
  // A .mjs script runs under plain node; TypeScript under the tsx loader.
  const script = options.script ?? "bench/job.ts";
  const loader = script.endsWith(".ts") ? ["--import", "tsx"] : [];
  return new Promise((resolve, reject) => {
    const child = spawn(
      process.execPath,
      [...(options.nodeArgs ?? []), ...loader, script, JSON.stringify(spec)],
      {
        cwd: options.cwd ?? ROOT,
        stdio: ["ignore", "pipe", "inherit"],
        env: process.env,
      },
    );
    let out = "";
    child.stdout.on("data", (chunk: Buffer) => {
      out += chunk.toString();
    });
    const timer = setTimeout(() => {
      child.kill("SIGKILL");
      reject(new Error(`bench job timed out after ${timeoutMs} ms: ${JSON.stringify(spec)}`));
    }, timeoutMs);
    child.on("error", reject);
    child.on("close", (code) => {
      clearTimeout(timer);
      const line = out.split("\n").find((l) => l.startsWith(RESULT_MARK));
      if (code !== 0 || !line) {
        reject(new Error(`bench job failed (exit ${code}): ${JSON.stringify(spec)}\n${out.slice(-2000)}`));
        return;
      }
      resolve(JSON.parse(line.slice(RESULT_MARK.length)) as T);
    });
  });
}

/** CPU seconds the whole machine has been busy (all cores, from /proc/stat; 0 where unreadable). */
export function machineCpuSeconds(): number {
  try {
    const line = readFileSync("/proc/stat", "utf8").split("\n")[0] ?? "";
    // cpu user nice system idle iowait irq softirq steal …, in USER_HZ (100 a second)
    const [user, nice, system, , , irq, softirq, steal] = line.trim().split(/\s+/).slice(1).map(Number);
    return ((user ?? 0) + (nice ?? 0) + (system ?? 0) + (irq ?? 0) + (softirq ?? 0) + (steal ?? 0)) / 100;
  } catch {
    return 0;
  }
}

/**
 * CPU seconds used by this process, and by everything else on the machine (Postgres, mostly: run the
 * benches on an otherwise quiet machine), between start() and stop().
 */
export function cpuMeter(): { stop(): { node: number; rest: number } } {
  const node0 = process.cpuUsage();
  const all0 = machineCpuSeconds();
  return {
    stop() {
      const d = process.cpuUsage(node0);
      const node = (d.user + d.system) / 1e6;
      return { node, rest: Math.max(0, machineCpuSeconds() - all0 - node) };
    },
  };
}
