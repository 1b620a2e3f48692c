import { readFile } from "node:fs/promises";
import path from "node:path";
import pg from "pg";
import { beforeAll, describe, expect, it } from "vitest";
import { startEmbeddedPostgres } from "../../src/embedded/embedded-postgres.js";
import { migrate } from "../../src/migrate/migrator.js";
import type { WorkerEvents } from "../../src/worker/events.js";
import { createWorker, type Worker } from "../../src/worker/worker.js";
import { testDatabase } from "../support/database.js";
import { testTempDir } from "../support/temp-dir.js";
import { nextEvent, publisherFor, until, workerFactory } from "../support/worker.js";

/**
 * Issue 26.8. The worker writes with `synchronous_commit = off`: a Postgres crash undoes its last acks, and
 * those rows come back under a lease of its own that it no longer holds. It takes them back at once. Leases
 * here last an hour, so only that can deliver them again before the test's waits give up.
 */
const HOUR_LEASE = 3_600_000;

function gate() {
  let open!: () => void;
  const opened = new Promise<void>((resolve) => {
    open = resolve;
  });
  return { opened, open };
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

/** SIGQUIT to the postmaster: an immediate shutdown, as a crash (WAL not yet written is lost). */
async function crash(dataDir: string): Promise<void> {
  const pid = Number((await readFile(path.join(dataDir, "postmaster.pid"), "utf8")).split("\n")[0]);
  process.kill(pid, "SIGQUIT");
  await until(() => !alive(pid), "the postmaster is gone", 60_000);
}

describe("after a Postgres crash", () => {
  it("a worker takes back at once the rows a crash left under its own leases, and loses none", {
    timeout: 1_200_000,
  }, async () => {
    // A server of this test's own: the shared one is never crashed.
    const dataDir = path.join(await testTempDir("outbox-crash-", 0o755), "data");
    let server = await startEmbeddedPostgres({ dataDir, persistent: true, startTimeoutMs: 300_000 });
    const port = server.port;
    const admin = new pg.Pool({ connectionString: server.url, max: 2 });
    admin.on("error", () => {});
    let worker: Worker | undefined;
    try {
      // The WAL writer writes asynchronous commits every 10 s (or per MB): the acks below stay in memory
      // until the crash. Nothing else may flush them: no autovacuum, no timed checkpoint.
      for (const setting of ["wal_writer_delay = '10s'", "autovacuum = off", "checkpoint_timeout = '1d'"]) {
        await admin.query(`ALTER SYSTEM SET ${setting}`);
      }
      await admin.query("SELECT pg_reload_conf()");
      await migrate({ connection: server.url, schema: "outbox" });
      await admin.query("CREATE TABLE flushed (at timestamptz)");
      const outbox = publisherFor("outbox");

      const runs = new Map<string, number>();
      const started: string[] = [];
      let hold = gate();
      const acked = new Set<string>();
      const again = new Set<string>();
      const reclaimed: WorkerEvents["reclaimed"][] = [];
      let crashed = false;
      worker = createWorker({
        connection: server.url,
        logger: false,
        leaseTtlMs: HOUR_LEASE,
        concurrency: 10,
        batchSize: 10,
        minPollIntervalMs: 20,
        maxPollIntervalMs: 200,
        loopBackoffBaseMs: 50,
        loopBackoffMaxMs: 1000,
        maxConsecutiveFailures: 100_000,
        queues: {
          crash: async (_p, m) => {
            runs.set(m.id, (runs.get(m.id) ?? 0) + 1);
            if (m.deliveries > 1) return;
            started.push(m.id);
            await hold.opened;
          },
        },
      });
      worker.on("acked", (e) => acked.add(e.id));
      worker.on("dispatched", (e) => {
        if (crashed) again.add(e.id);
      });
      worker.on("reclaimed", (e) => reclaimed.push(e));
      await worker.start();

      const left = async () => {
        try {
          return (await admin.query("SELECT count(*)::int AS n FROM outbox.messages")).rows[0].n as number;
        } catch {
          return -1; // the server is away
        }
      };

      /** 10 rows acked, then a crash: → the rows acked before it and delivered again after it. */
      async function crashRound(): Promise<string[]> {
        hold = gate();
        started.length = 0;
        again.clear();
        const client = await admin.connect();
        const ids = await outbox.publishMany(
          client,
          "crash",
          Array.from({ length: 10 }, (_, i) => ({ payload: { i } })),
        );
        client.release();
        await until(() => started.length === ids.length, "every row leased and its handler running", 60_000);
        // A synchronous commit that wrote WAL flushes it up to there, so the leases are on disk: after the
        // crash the rows are under this worker's tokens, not unleased.
        await admin.query("INSERT INTO flushed VALUES (now())");
        hold.open();
        await until(() => ids.every((id) => acked.has(id)), "every ack landed", 60_000);
        crashed = true;
        await crash(dataDir);
        await server.stop();
        server = await startEmbeddedPostgres({ dataDir, persistent: true, port, startTimeoutMs: 300_000 });
        // Bounded only against a hang: leased for an hour, the rows the crash brought back under this
        // worker's old tokens are delivered within this only if the worker takes them back.
        await until(
          async () => ids.every((id) => runs.has(id)) && (await left()) === 0,
          "every row handled and the table empty",
          300_000,
        );
        crashed = false;
        return ids.filter((id) => again.has(id));
      }

      // The WAL writer's 10 s tick may write the acks just before the crash: then there is nothing to take
      // back, and the round proves nothing. Another round, then.
      const redelivered: string[] = [];
      for (let round = 0; round < 3 && redelivered.length === 0; round++) {
        redelivered.push(...(await crashRound()));
      }
      expect(redelivered.length).toBeGreaterThan(0);
      // Each of them was taken back (none waited for its lease), and each delivery of it counted.
      expect(reclaimed.reduce((n, e) => n + e.count, 0)).toBe(redelivered.length);
      for (const id of redelivered) expect(runs.get(id)).toBe(2);
      expect((await admin.query("SELECT count(*)::int AS n FROM outbox.dead_letters")).rows[0].n).toBe(0);
    } finally {
      await worker?.stop({ timeoutMs: 2000 });
      await admin.end();
      await server.stop();
    }
  });
});

describe("identity", () => {
  const db = testDatabase("own");
  const workers = workerFactory(db);
  const outbox = publisherFor(db.schema);
  beforeAll(async () => {
    await db.migrate();
    await db.pool.query(`CREATE TABLE "${db.schema}".undo (LIKE ${db.names.messages})`);
  });

  const publish = async (queue: string) =>
    (await db.inTransaction((c) => outbox.publishMany(c, queue, [{ payload: {} }])))[0] as string;
  const lease = async (id: string) =>
    (
      await db.pool.query(
        `SELECT acquired_token, acquired_by, lease_expires_at, lease_expires_at <= now() AS expired
         FROM ${db.names.messages} WHERE id = $1`,
        [id],
      )
    ).rows[0];

  it("a worker takes back only rows under its own tokens: never those another process with its workerId holds", async () => {
    // Two processes on one host: the same workerId (acquired_by), different tokens.
    const workerId = `shared-host-${process.pid}`;
    const gateB = gate();
    const startedB: string[] = [];
    const b = await workers.start({
      workerId,
      leaseTtlMs: HOUR_LEASE,
      queues: {
        s: async (_p, m) => {
          startedB.push(m.id);
          await gateB.opened;
        },
      },
    });
    const y = await publish("s");
    await until(() => startedB.includes(y), "B runs its row");

    // A also serves "s" (so B's row is in its statement's reach); its own rows come from "a" only.
    const poolA = new pg.Pool({ connectionString: db.url, application_name: "own-leases-a", max: 4 });
    poolA.on("error", () => {});
    let a: Worker | undefined;
    try {
      const gates = new Map([
        ["x", gate()],
        ["w", gate()],
      ]);
      const runsA = new Map<string, number>();
      const startedA: string[] = [];
      a = await workers.start({
        workerId,
        connection: poolA,
        leaseTtlMs: HOUR_LEASE,
        loopBackoffBaseMs: 50,
        loopBackoffMaxMs: 500,
        queues: {
          s: () => {},
          a: async (p, m) => {
            runsA.set(m.id, (runsA.get(m.id) ?? 0) + 1);
            if (m.deliveries > 1) return;
            startedA.push(m.id);
            await gates.get(String((p as { gate?: string }).gate))?.opened;
          },
        },
      });
      const lost: unknown[] = [];
      for (const w of [a, b]) w.on("lease_lost", (e) => lost.push(e));

      // A's ack of x is undone, as a crash would: the row is back under A's token, A no longer holds it.
      const [x] = await db.inTransaction((c) => outbox.publishMany(c, "a", [{ payload: { gate: "x" } }]));
      await until(() => startedA.includes(x as string), "A runs x");
      await db.pool.query(
        `INSERT INTO "${db.schema}".undo SELECT * FROM ${db.names.messages} WHERE id = $1`,
        [x],
      );
      const ackedX = nextEvent<{ id: string }>(a, "acked", (e) => e.id === x);
      gates.get("x")?.open();
      await ackedX;
      await db.pool.query(
        `INSERT INTO ${db.names.messages} OVERRIDING SYSTEM VALUE SELECT * FROM "${db.schema}".undo`,
      );
      const [w] = await db.inTransaction((c) => outbox.publishMany(c, "a", [{ payload: { gate: "w" } }]));
      await until(() => startedA.includes(w as string), "A runs w");

      const before = { y: await lease(y), w: await lease(w as string), x: await lease(x as string) };
      expect(before.y.acquired_by).toBe(workerId);
      expect(before.w.acquired_by).toBe(workerId);
      expect(before.x.acquired_by).toBe(workerId);
      expect(before.x.expired).toBe(false);

      // A loses its connections (as on a server restart): once it reaches the server again it takes back x.
      const reclaimed = nextEvent<WorkerEvents["reclaimed"]>(a, "reclaimed");
      await db.pool.query(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'own-leases-a'",
      );
      expect(await reclaimed).toEqual({ count: 1, queues: { a: 1 } });
      // B's row, running under its lease, and A's own running row are untouched.
      expect(await lease(y)).toEqual(before.y);
      expect(await lease(w as string)).toEqual(before.w);
      await until(() => runsA.get(x as string) === 2, "x delivered again, an hour before its lease ends");

      gateB.open();
      gates.get("w")?.open();
      await until(
        async () =>
          (await db.pool.query(`SELECT count(*)::int AS n FROM ${db.names.messages}`)).rows[0].n === 0,
        "every row acknowledged",
      );
      expect(lost).toEqual([]);
    } finally {
      // Before its pool ends (the factory's own stop comes later, and is then a no-op).
      await a?.stop({ timeoutMs: 2000 });
      await poolA.end();
    }
  });
});
