/**
 * Issue 26.8: a Postgres crash mid-drain. A private embedded Postgres (never the shared one), `rows` rows, one
 * worker with default options (but `maxConsecutiveFailures`); once `crashAfter` acks have landed the postmaster gets SIGQUIT (an immediate
 * shutdown: no checkpoint, the WAL not yet written is lost, as in a crash) and is started again on the same
 * data folder and port. With `synchronous_commit = off` (the worker's default) the crash undoes its last
 * writes. Prints per run: how long Postgres was away, the time from Postgres up to the drain's end, the
 * worker's `lease_lost` and `reclaimed` counts, and the rows handled twice.
 *
 *   npx tsx bench/crash-restart.ts [--rows 20000] [--crash-after 5000] [--runs 3]
 */
import { chmod, mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import pg from "pg";
import { startEmbeddedPostgres } from "../src/embedded/embedded-postgres.js";
import { migrate } from "../src/migrate/migrator.js";
import { createWorker } from "../src/worker/worker.js";
import { arg, fmt, median, PAYLOAD_SQL, sleep, until } from "./lib.js";

const ROWS = Number(arg("rows", "20000"));
const CRASH_AFTER = Number(arg("crash-after", "5000"));
const RUNS = Number(arg("runs", "3"));

interface Run {
  awayMs: number;
  upToDrainMs: number;
  leaseLost: number;
  reclaimed: number;
  twice: number;
}

/** SIGQUIT to the postmaster: Postgres's immediate shutdown, which recovers from the WAL on the next start. */
async function crash(dataDir: string): Promise<void> {
  const pid = Number((await readFile(path.join(dataDir, "postmaster.pid"), "utf8")).split("\n")[0]);
  process.kill(pid, "SIGQUIT");
  await until(() => {
    try {
      process.kill(pid, 0);
      return false;
    } catch {
      return true;
    }
  }, 60_000);
}

async function once(): Promise<Run> {
  const dir = await mkdtemp(path.join(tmpdir(), "outbox-bench-crash-"));
  await chmod(dir, 0o755);
  const dataDir = path.join(dir, "data");
  let server = await startEmbeddedPostgres({ dataDir, persistent: true });
  const port = server.port;
  const admin = new pg.Pool({ connectionString: server.url, max: 1 });
  admin.on("error", () => {});
  try {
    await migrate({ connection: server.url, schema: "outbox" });
    await admin.query(
      `INSERT INTO outbox.messages (queue, payload) SELECT 'bench.crash', ${PAYLOAD_SQL} FROM generate_series(1, $1) AS g`,
      [ROWS],
    );
    await admin.query("VACUUM ANALYZE outbox.messages");
    await admin.query("CHECKPOINT");
    const runs = new Map<string, number>();
    let acked = 0;
    let leaseLost = 0;
    let reclaimed = 0;
    const worker = createWorker({
      connection: server.url,
      logger: false,
      // The default 30 s of failures in a row would end a worker whose Postgres restarts slowly.
      maxConsecutiveFailures: 1000,
      queues: { "bench.crash": (_p, m) => void runs.set(m.id, (runs.get(m.id) ?? 0) + 1) },
    });
    worker.on("acked", () => void acked++);
    worker.on("lease_lost", () => void leaseLost++);
    worker.on("reclaimed", (e) => {
      reclaimed += e.count;
    });
    await worker.start();
    try {
      await until(() => acked >= CRASH_AFTER, 120_000, 1);
      const down = performance.now();
      await crash(dataDir);
      await server.stop();
      server = await startEmbeddedPostgres({ dataDir, persistent: true, port });
      const up = performance.now();
      const left = async () => {
        try {
          return (await admin.query("SELECT count(*)::int AS n FROM outbox.messages")).rows[0].n as number;
        } catch {
          return -1;
        }
      };
      await until(async () => runs.size === ROWS && (await left()) === 0, 600_000, 20);
      const end = performance.now();
      let twice = 0;
      for (const n of runs.values()) if (n > 1) twice++;
      return { awayMs: up - down, upToDrainMs: end - up, leaseLost, reclaimed, twice };
    } finally {
      await worker.stop({ timeoutMs: 5000 });
    }
  } finally {
    await admin.end().catch(() => {});
    await server.stop();
    await rm(dir, { recursive: true, force: true });
  }
}

const results: Run[] = [];
for (let i = 0; i < RUNS; i++) {
  const r = await once();
  results.push(r);
  console.log(
    `run ${i + 1}: Postgres away ${fmt(r.awayMs)} ms, up → drained ${fmt(r.upToDrainMs)} ms, lease_lost ${r.leaseLost}, reclaimed ${r.reclaimed}, handled twice ${r.twice}`,
  );
  await sleep(500);
}
const m = (f: (r: Run) => number) => fmt(median(results.map(f)));
const drains = results.map((r) => r.upToDrainMs);
console.log(
  `median of ${RUNS}: away ${m((r) => r.awayMs)} ms, up → drained ${m((r) => r.upToDrainMs)} ms (max ${fmt(Math.max(...drains))}; ${drains.filter((ms) => ms > 10_000).length} runs over 10 s), lease_lost ${m((r) => r.leaseLost)}, reclaimed ${m((r) => r.reclaimed)}, twice ${m((r) => r.twice)}`,
);
