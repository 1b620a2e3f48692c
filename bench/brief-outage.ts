/**
 * Issue 41.5: a sub-second Postgres outage under a worker with an inbox queue. A private embedded Postgres
 * (never the shared one); a producer keeps publishing while one worker (default options) drains an inbox
 * queue; once it has acked `crashAfter` rows the postmaster gets SIGQUIT (an immediate shutdown) and is
 * started again on the same data folder and port. Prints per run: how long Postgres was away, whether the
 * worker went fatal (and how soon after the crash), the fetch failures in a row it counted, and whether
 * every published message was delivered afterwards.
 *
 *   npx tsx bench/brief-outage.ts [--runs 8] [--crash-after 2000] [--inbox true]
 */
import { chmod, mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import pg from "pg";
import { startEmbeddedPostgres } from "../src/embedded/embedded-postgres.js";
import { migrate } from "../src/migrate/migrator.js";
import { createPublisher } from "../src/produce/publisher.js";
import { createWorker } from "../src/worker/worker.js";
import { arg, fmt, sleep, until } from "./lib.js";

const RUNS = Number(arg("runs", "8"));
const CRASH_AFTER = Number(arg("crash-after", "2000"));
const INBOX = arg("inbox", "true") === "true";
/** Rows queued before the worker starts, so that it has a backlog (full local queue) when Postgres goes. */
const BACKLOG = Number(arg("backlog", "20000"));
/** Postgres stays down at least this long before it is started again (the start adds ~150 ms). */
const DOWN_MS = Number(arg("down-ms", "500"));

interface Run {
  awayMs: number;
  fatalAfterMs: number | undefined;
  fetchFailures: number;
  delivered: boolean;
}

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
  const dir = await mkdtemp(path.join(tmpdir(), "outbox-bench-outage-"));
  await chmod(dir, 0o755);
  const dataDir = path.join(dir, "data");
  let server = await startEmbeddedPostgres({ dataDir, persistent: true });
  const port = server.port;
  const producer = new pg.Pool({ connectionString: server.url, max: 2 });
  producer.on("error", () => {});
  const outbox = createPublisher({ schema: "outbox" });
  let producing = true;
  const published = new Set<string>();
  const produce = (async () => {
    let i = 0;
    while (producing) {
      try {
        const c = await producer.connect();
        const ignore = () => {};
        c.on("error", ignore);
        try {
          await c.query("BEGIN");
          const ids = await outbox.publishMany(
            c,
            "bench.outage",
            Array.from({ length: 20 }, () => ({ payload: { i: i++ } })),
          );
          await c.query("COMMIT");
          for (const id of ids) published.add(id);
        } finally {
          c.off("error", ignore);
          c.release(true);
        }
      } catch {
        await sleep(20);
      }
    }
  })();
  try {
    await migrate({ connection: server.url, schema: "outbox" });
    const seeded = await producer.query(
      "INSERT INTO outbox.messages (queue, payload) SELECT 'bench.outage', jsonb_build_object('g', g) FROM generate_series(1, $1) AS g RETURNING id::text",
      [BACKLOG],
    );
    for (const r of seeded.rows) published.add(r.id);
    const handled = new Set<string>();
    let acked = 0;
    let fetchFailures = 0;
    let fatalAt: number | undefined;
    const worker = createWorker({
      connection: server.url,
      logger: false,
      queues: {
        "bench.outage": {
          handler: (_p, m) => void handled.add(m.id),
          ...(INBOX ? { inbox: true } : {}),
        },
      },
    });
    worker.on("acked", () => void acked++);
    worker.on("loop_error", (e) => {
      if (e.loop === "fetch") fetchFailures = Math.max(fetchFailures, e.consecutive);
    });
    worker.on("fatal", () => {
      fatalAt = performance.now();
    });
    await worker.start();
    try {
      await until(() => acked >= CRASH_AFTER, 120_000, 1);
      const down = performance.now();
      await crash(dataDir);
      await server.stop();
      await sleep(Math.max(0, DOWN_MS - (performance.now() - down)));
      server = await startEmbeddedPostgres({ dataDir, persistent: true, port });
      const up = performance.now();
      producing = false;
      await produce;
      let delivered = false;
      if (fatalAt === undefined) {
        try {
          await until(
            () => fatalAt !== undefined || [...published].every((id) => handled.has(id)),
            120_000,
            20,
          );
          delivered = fatalAt === undefined;
        } catch {}
      }
      return {
        awayMs: up - down,
        fatalAfterMs: fatalAt === undefined ? undefined : fatalAt - down,
        fetchFailures,
        delivered,
      };
    } finally {
      await worker.stop({ timeoutMs: 3000 }).catch(() => {});
    }
  } finally {
    producing = false;
    await produce;
    await producer.end().catch(() => {});
    await server.stop();
    await rm(dir, { recursive: true, force: true });
  }
}

let fatal = 0;
for (let i = 0; i < RUNS; i++) {
  const r = await once();
  if (r.fatalAfterMs !== undefined) fatal++;
  console.log(
    `run ${i + 1}: Postgres away ${fmt(r.awayMs)} ms, ${
      r.fatalAfterMs === undefined ? "survived" : `fatal ${fmt(r.fatalAfterMs)} ms after the crash`
    }, fetch failures in a row ${r.fetchFailures}, every message delivered: ${r.delivered}`,
  );
  await sleep(500);
}
console.log(`${INBOX ? "inbox" : "no inbox"}: ${fatal} of ${RUNS} brief outages went fatal`);
