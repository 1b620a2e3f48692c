import { spawn } from "node:child_process";
import { chmod, mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { beforeAll, beforeEach, describe, expect, it } from "vitest";
import { startEmbeddedPostgres } from "../../src/embedded/embedded-postgres.js";
import { migrate } from "../../src/migrate/migrator.js";
import { createWorker } from "../../src/worker/worker.js";
import { CountingPool } from "../support/counting-pool.js";
import { testDatabase } from "../support/database.js";
import { nextEvent, publisherFor, until, workerFactory } from "../support/worker.js";

const db = testDatabase("flt");
const workers = workerFactory(db);
const outbox = publisherFor(db.schema);

beforeAll(async () => {
  await db.migrate();
  await db.pool.query(`CREATE TABLE "${db.schema}".ledger (id bigint NOT NULL, worker text NOT NULL)`);
});
beforeEach(async () => {
  await db.pool.query(`TRUNCATE ${db.names.messages}, ${db.names.deadLetters}, "${db.schema}".ledger`);
});

async function publish(queue: string, n: number) {
  return db.inTransaction((c) =>
    outbox.publishMany(
      c,
      queue,
      Array.from({ length: n }, (_, i) => ({ payload: { i } })),
    ),
  );
}

async function remaining(): Promise<number> {
  return (await db.pool.query(`SELECT count(*)::int AS n FROM ${db.names.messages}`)).rows[0].n;
}

describe("wake-ups", () => {
  it("after the listener connection is terminated, rows inserted in the gap are fetched on the reconnect", async () => {
    const handled: string[] = [];
    // Polling once an hour: only a wake-up (a notification, the reconnect's fetch) explains a delivery.
    const worker = await workers.start({
      minPollIntervalMs: 3_600_000,
      maxPollIntervalMs: 3_600_000,
      queues: { wake: (_p, m) => void handled.push(m.id) },
    });
    await publish("wake", 1);
    await until(() => handled.length === 1, "first row via NOTIFY");

    const away = nextEvent<{ state: string }>(worker, "listener", (e) => e.state === "reconnecting");
    const reconnected = nextEvent<{ state: string }>(worker, "listener", (e) => e.state === "listening");
    await db.pool.query(
      "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1",
      [`outbox-listen ${worker.id}`.slice(0, 63)],
    );
    // Published while the listener is away (its reconnect waits a backoff first): its notification is
    // lost; the reconnect must fetch.
    await away;
    await publish("wake", 3);
    await reconnected;
    await until(() => handled.length === 4, "rows from the gap");
  });

  it("with LISTEN off, the next poll after a row commits delivers it", async () => {
    // Counted in polls, not milliseconds: how often the worker polls is worker-polling.test.ts's subject.
    const pool = new CountingPool({ connectionString: db.url, max: 6 });
    let leasesWhenHandled = Number.NaN;
    const worker = await workers.start({
      connection: pool,
      listen: false,
      minPollIntervalMs: 50,
      maxPollIntervalMs: 400,
      queues: {
        poll: () => {
          leasesWhenHandled = pool.leases;
        },
      },
    });
    try {
      await until(() => pool.leases >= 2, "the worker polling");
      await db.pool.query(`INSERT INTO ${db.names.messages} (queue, payload) VALUES ('poll', '{}')`);
      const committed = pool.leases;
      await nextEvent(worker, "acked");
      // The first lease sent after the commit found it (or one sent while it committed did).
      expect(leasesWhenHandled - committed).toBeLessThanOrEqual(1);
    } finally {
      await worker.stop();
      await pool.end();
    }
  });
});

describe("database failures", () => {
  it.each(["token", "transaction"] as const)(
    "leaseMode %s: recovers when every worker connection is terminated, and finishes the backlog",
    async (leaseMode) => {
      await publish("term", 200);
      let handled = 0;
      const worker = await workers.start({
        leaseMode,
        concurrency: 2,
        batchSize: 20,
        loopBackoffBaseMs: 20,
        loopBackoffMaxMs: 200,
        queues: {
          term: async () => {
            handled++;
            await new Promise((r) => setTimeout(r, 2));
          },
        },
      });
      await until(() => handled >= 40, "some progress");
      const killed = await db.pool.query(
        "SELECT count(pg_terminate_backend(pid))::int AS n FROM pg_stat_activity WHERE application_name LIKE $1",
        [`outbox-%${worker.id}`.slice(0, 63)],
      );
      expect(killed.rows[0].n).toBeGreaterThan(0);
      await publish("term", 50);
      await until(async () => (await remaining()) === 0, "backlog drained after the kill", 60_000);
      expect(handled).toBeGreaterThanOrEqual(250);
    },
  );

  it("survives a Postgres restart and finishes the backlog", async () => {
    const dir = await mkdtemp(path.join(tmpdir(), "outbox-restart-"));
    await chmod(dir, 0o755);
    const dataDir = path.join(dir, "data");
    let server = await startEmbeddedPostgres({ dataDir, persistent: true });
    const port = server.port;
    try {
      await migrate({ connection: server.url, schema: "outbox" });
      const restartOutbox = publisherFor("outbox");
      const pg = (await import("pg")).default;
      const producer = new pg.Pool({ connectionString: server.url, max: 2 });
      producer.on("error", () => {});
      const handled = new Set<string>();
      const errors: string[] = [];
      const worker = createWorker({
        connection: server.url,
        logger: false,
        minPollIntervalMs: 20,
        maxPollIntervalMs: 200,
        loopBackoffBaseMs: 50,
        loopBackoffMaxMs: 300,
        maxConsecutiveFailures: 1000,
        queues: { restart: (_p, m) => void handled.add(m.id) },
      });
      worker.on("loop_error", (e) => errors.push(e.loop));
      await worker.start();
      try {
        const c1 = await producer.connect();
        await restartOutbox.publishMany(c1, "restart", [{ payload: { before: true } }]);
        c1.release();
        await until(() => handled.size === 1, "delivery before the restart");

        await server.stop();
        await until(() => errors.includes("fetch"), "the worker notices the outage");
        server = await startEmbeddedPostgres({ dataDir, persistent: true, port });

        const c2 = await producer.connect();
        await restartOutbox.publishMany(
          c2,
          "restart",
          Array.from({ length: 30 }, (_, i) => ({ payload: { i } })),
        );
        c2.release();
        const left = async () =>
          (await producer.query("SELECT count(*)::int AS n FROM outbox.messages")).rows[0].n;
        await until(async () => (await left()) === 0, "backlog acknowledged after the restart", 30_000);
        expect(handled.size).toBe(31);
      } finally {
        await worker.stop({ timeoutMs: 2000 });
        await producer.end();
      }
    } finally {
      await server.stop();
      await rm(dir, { recursive: true, force: true });
    }
  }, 300_000);

  it("reports a fatal error after a run of consecutive failures instead of idling", async () => {
    const worker = createWorker({
      connection: "postgres://nobody@127.0.0.1:1/none",
      listen: false,
      logger: false,
      queues: { q: () => {} },
      maxConsecutiveFailures: 3,
      loopBackoffBaseMs: 10,
      loopBackoffMaxMs: 20,
    });
    const fatal = nextEvent<{ error: Error }>(worker, "fatal", undefined, 10_000);
    await worker.start();
    expect((await fatal).error.message).toMatch(/ECONNREFUSED/);
    await expect(worker.wait()).rejects.toThrow(/ECONNREFUSED/);
  });
});

describe("crash", () => {
  it("a worker killed with SIGKILL mid-batch loses nothing; duplicates are bounded by the rows it held", async () => {
    const ids = await publish("crash", 300);
    const workerId = `crash-child-${Date.now()}`;
    // node itself, with tsx as a loader: the tsx CLI would run the worker in a grandchild that SIGKILL misses.
    const child = spawn(
      process.execPath,
      ["--import", "tsx", path.resolve("test/support/fixtures/crash-worker.ts")],
      {
        // PGAPPNAME names the child's other sessions (its ledger pool) after it too.
        env: {
          ...process.env,
          DATABASE_URL: db.url,
          OUTBOX_SCHEMA: db.schema,
          WORKER_ID: workerId,
          PGAPPNAME: `crash-ledger ${workerId}`,
        },
        stdio: ["ignore", "pipe", "inherit"],
      },
    );
    const exited = new Promise((resolve) => child.once("exit", resolve));
    /** The child's database sessions (its worker's, its listener's, its ledger pool's), by name. */
    const childSessions = async (prefix = "") =>
      (
        await db.pool.query(
          "SELECT count(*)::int AS n FROM pg_stat_activity WHERE application_name LIKE $1 || '%' || $2 || '%'",
          [prefix, workerId],
        )
      ).rows[0].n as number;
    try {
      await until(
        async () =>
          (await db.pool.query(`SELECT count(*)::int AS n FROM "${db.schema}".ledger`)).rows[0].n >= 30,
        // The child is node with a TypeScript loader: its start takes a while on a busy machine.
        "the child is handling rows",
        120_000,
      );
      expect(
        await childSessions("crash-ledger"),
        "the child's ledger sessions carry its name",
      ).toBeGreaterThan(0);
    } finally {
      child.kill("SIGKILL");
    }
    await exited;
    // The process is gone, but a statement it sent just before may still be running and commit. A server
    // session ends only after its statement does and it reads the closed socket: once none of the child's
    // sessions is left, nothing of the child can write any more.
    await until(async () => (await childSessions()) === 0, "the killed child's database sessions have ended");
    const heldByDead = (
      await db.pool.query(`SELECT count(*)::int AS n FROM ${db.names.messages} WHERE acquired_by = $1`, [
        workerId,
      ])
    ).rows[0].n;
    expect(heldByDead).toBeGreaterThan(0);
    // Instead of waiting a lease TTL: the dead worker's leases run out now.
    await db.pool.query(
      `UPDATE ${db.names.messages} SET lease_expires_at = now() - interval '1 second' WHERE acquired_by = $1`,
      [workerId],
    );
    await workers.start({
      queues: {
        crash: async (_p, m) => {
          await db.pool.query(`INSERT INTO "${db.schema}".ledger (id, worker) VALUES ($1, 'survivor')`, [
            m.id,
          ]);
        },
      },
    });
    await until(async () => (await remaining()) === 0, "survivor drains everything", 30_000);
    const ledger = await db.pool.query(
      `SELECT id::text, count(*)::int AS n FROM "${db.schema}".ledger GROUP BY id`,
    );
    const seen = new Map(ledger.rows.map((r) => [r.id as string, r.n as number]));
    expect(ids.filter((id) => !seen.has(id))).toEqual([]);
    const duplicates = [...seen.values()].reduce((sum, n) => sum + (n - 1), 0);
    expect(duplicates).toBeLessThanOrEqual(heldByDead);
    expect((await db.pool.query(`SELECT count(*)::int AS n FROM ${db.names.deadLetters}`)).rows[0].n).toBe(0);
  }, 300_000);
});
