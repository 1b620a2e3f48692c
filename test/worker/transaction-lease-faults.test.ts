import { spawn } from "node:child_process";
import { chmod, mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { beforeAll, beforeEach, describe, expect, it } from "vitest";
import { startEmbeddedPostgres } from "../../src/embedded/embedded-postgres.js";
import { migrate } from "../../src/migrate/migrator.js";
import { createWorker } from "../../src/worker/worker.js";
import { testDatabase } from "../support/database.js";
import { startPostgresProxy, throughProxy } from "../support/tcp-proxy.js";
import { killBatchesOf, publisherFor, until, workerFactory } from "../support/worker.js";

/**
 * leaseMode "transaction" under the faults the token lease is proven against (issue 30 "Must hold"): a
 * worker killed with SIGKILL, a Postgres restart, black-holed connections, a crash loop, per-key order and
 * follow-ups. Every connection terminated: worker-faults.test.ts (both modes); PgBouncer: pgbouncer.test.ts.
 */

const db = testDatabase("txfault");
const workers = workerFactory(db);
const outbox = publisherFor(db.schema);
const m = db.names.messages;
const guards = `${db.names.quotedSchema}.lease_guards`;
const mode = { leaseMode: "transaction" } as const;

beforeAll(async () => {
  await db.migrate();
  await db.pool.query(`CREATE TABLE "${db.schema}".ledger (id bigint NOT NULL, worker text NOT NULL)`);
});
beforeEach(async () => {
  await db.pool.query(`TRUNCATE ${m}, ${db.names.deadLetters}, ${guards}, "${db.schema}".ledger`);
});

async function publish(queue: string, n: number, key?: (i: number) => string): Promise<string[]> {
  return db.inTransaction((c) =>
    outbox.publishMany(
      c,
      queue,
      Array.from({ length: n }, (_, i) => ({ payload: { i }, ...(key ? { key: key(i) } : {}) })),
    ),
  );
}

const scalar = async (sql: string, params: unknown[] = []) =>
  (await db.pool.query(sql, params)).rows[0]?.n as number;
const remaining = () => scalar(`SELECT count(*)::int AS n FROM ${m}`);

describe("leaseMode transaction: faults", () => {
  it("a worker killed with SIGKILL mid-batch loses nothing; duplicates are bounded by its guards' rows, each counted", async () => {
    const ids = await publish("crash", 300);
    const workerId = `txcrash-${Date.now()}`;
    // node itself, with tsx as a loader: the tsx CLI would run the worker in a grandchild that SIGKILL misses.
    const child = spawn(
      process.execPath,
      ["--import", "tsx", path.resolve("test/support/fixtures/crash-worker.ts")],
      {
        env: {
          ...process.env,
          DATABASE_URL: db.url,
          OUTBOX_SCHEMA: db.schema,
          WORKER_ID: workerId,
          LEASE_MODE: "transaction",
          PGAPPNAME: `crash-ledger ${workerId}`,
        },
        stdio: ["ignore", "pipe", "inherit"],
      },
    );
    const exited = new Promise((resolve) => child.once("exit", resolve));
    const childSessions = async () =>
      scalar("SELECT count(*)::int AS n FROM pg_stat_activity WHERE application_name LIKE '%' || $1 || '%'", [
        workerId,
      ]);
    try {
      await until(
        async () => (await scalar(`SELECT count(*)::int AS n FROM "${db.schema}".ledger`)) >= 30,
        "the child is handling rows",
        120_000,
      );
    } finally {
      child.kill("SIGKILL");
    }
    await exited;
    // Once none of the child's sessions is left, its transactions are rolled back and nothing of it writes.
    await until(async () => (await childSessions()) === 0, "the killed child's database sessions have ended");
    // What the dead worker held: the rows its guards name (its batches in flight), never written on.
    const held = (
      await db.pool.query(
        `SELECT COALESCE(array_agg(u.id::text), '{}') AS ids FROM ${guards} g, unnest(g.ids) u(id)
       WHERE g.worker = $1`,
        [workerId],
      )
    ).rows[0].ids as string[];
    expect(held.length).toBeGreaterThan(0);
    expect(await scalar(`SELECT count(*)::int AS n FROM ${m} WHERE acquired_by = $1`, [workerId])).toBe(0);
    const counts = new Map<string, number>();
    await workers.start({
      ...mode,
      queues: {
        crash: async (_p, msg) => {
          counts.set(msg.id, msg.deliveries);
          await db.pool.query(`INSERT INTO "${db.schema}".ledger (id, worker) VALUES ($1, 'survivor')`, [
            msg.id,
          ]);
        },
      },
    });
    await until(async () => (await remaining()) === 0, "the survivor drains everything", 60_000);
    const ledger = await db.pool.query(
      `SELECT id::text, count(*)::int AS n FROM "${db.schema}".ledger GROUP BY id`,
    );
    const seen = new Map(ledger.rows.map((r) => [r.id as string, r.n as number]));
    expect(ids.filter((id) => !seen.has(id))).toEqual([]);
    const duplicates = [...seen.values()].reduce((sum, n) => sum + (n - 1), 0);
    expect(duplicates).toBeLessThanOrEqual(held.length);
    // The survivor's repair counted the crashed delivery before it leased those rows again.
    const stillThere = held.filter((id) => counts.has(id));
    expect(stillThere.length).toBeGreaterThan(0);
    expect(stillThere.filter((id) => counts.get(id) !== 2)).toEqual([]);
    expect(await scalar(`SELECT count(*)::int AS n FROM ${guards}`)).toBe(0);
    expect(await scalar(`SELECT count(*)::int AS n FROM ${db.names.deadLetters}`)).toBe(0);
  }, 300_000);

  it("a message that kills its batch every time is dead-lettered as max_deliveries", async () => {
    const [id] = await publish("loop", 1);
    let runs = 0;
    const workerId = `txloop-${Date.now()}`;
    await workers.start({
      ...mode,
      workerId,
      maxDeliveries: 3,
      loopBackoffBaseMs: 10,
      loopBackoffMaxMs: 50,
      queues: {
        loop: async () => {
          runs++;
          // The handler's own batch, killed under it: as if the process died mid-handler.
          await killBatchesOf(db.pool, workerId);
        },
      },
    });
    await until(
      async () => (await scalar(`SELECT count(*)::int AS n FROM ${db.names.deadLetters}`)) === 1,
      "dead-lettered",
    );
    const dead = (await db.pool.query(`SELECT * FROM ${db.names.deadLetters} WHERE id = $1`, [id])).rows[0];
    expect(dead.reason).toBe("max_deliveries");
    expect(runs).toBe(3);
  });

  it("keeps per-key order across batches and concurrent handlers", async () => {
    const keys = 12;
    const perKey = 25;
    await publish("ordered", keys * perKey, (i) => `k${i % keys}`);
    const order = new Map<string, number[]>();
    await workers.start({
      ...mode,
      concurrency: 8,
      batchSize: 10,
      queues: {
        ordered: async (payload: unknown, msg) => {
          const { i } = payload as { i: number };
          const key = msg.key as string;
          order.set(key, [...(order.get(key) ?? []), i]);
          await new Promise((r) => setTimeout(r, i % 3));
        },
      },
    });
    await until(async () => (await remaining()) === 0, "every keyed row acked", 60_000);
    for (let k = 0; k < keys; k++) {
      const expected = Array.from({ length: perKey }, (_, j) => j * keys + k);
      expect(order.get(`k${k}`)).toEqual(expected);
    }
  });

  it("two batches' follow-ups to the same keys: each batch's land with its commit, once, neither waiting on the other", async () => {
    await publish("parent", 20);
    const children: number[] = [];
    const duplicates: string[] = [];
    const parents = new Set<string>();
    // Every parent handler waits until all 20 run: two batches of 10 then write their outcomes together,
    // each with follow-ups to the keys c0, c1 and c2 (held by a batch from its write to its commit).
    let release!: () => void;
    const together = new Promise<void>((resolve) => {
      release = resolve;
    });
    await workers.start({
      ...mode,
      batchSize: 10,
      concurrency: 20,
      queues: {
        parent: async (payload: unknown, msg) => {
          if (parents.has(msg.id)) duplicates.push(msg.id);
          parents.add(msg.id);
          if (parents.size === 20) release();
          await together;
          const { i } = payload as { i: number };
          msg.publish("child", { from: i }, { key: `c${i % 3}` });
        },
        child: (payload: unknown) => void children.push((payload as { from: number }).from),
      },
    });
    await until(
      async () => (await remaining()) === 0 && children.length === 20,
      "parents and children handled",
    );
    expect(children.sort((a, b) => a - b)).toEqual(Array.from({ length: 20 }, (_, i) => i));
    // A batch gives up on keys another batch holds only after BUSY_GIVE_UP_MS: its parents would come again.
    expect(duplicates).toEqual([]);
  });

  it("black-holed connections: the server ends the batch's transaction, and a fresh worker delivers its rows", async () => {
    const proxy = await startPostgresProxy(db.url);
    try {
      const ids = await publish("bh", 5);
      const started: string[] = [];
      await workers.start({
        ...mode,
        connection: throughProxy(db.url, proxy),
        listen: false,
        leaseTtlMs: 3000,
        handlerTimeoutMs: 500,
        maxConsecutiveFailures: 10_000,
        queues: {
          bh: async (_p, msg) => {
            started.push(msg.id);
            if (started.length > 1) return;
            // Black-holed while the batch runs: its COMMIT never reaches the server, and when the worker gives
            // up on the connection, neither does its close. The server is left with the session idle in its
            // transaction, holding the batch's rows.
            proxy.freezeOpen({ strandServerSide: true });
          },
        },
      });
      await until(() => started.length > 0, "the batch started");
      // Idle in transaction past the longest handler timeout plus two query timeouts: the server ends it.
      const handled: string[] = [];
      await workers.start({ ...mode, queues: { bh: (_p, msg) => void handled.push(msg.id) } });
      await until(
        async () => (await remaining()) === 0,
        "the fresh worker delivers the frozen batch's rows",
        60_000,
      );
      expect(new Set([...handled, ...started])).toEqual(new Set(ids));
      expect(await scalar(`SELECT count(*)::int AS n FROM ${db.names.deadLetters}`)).toBe(0);
    } finally {
      await proxy.close();
    }
  });
});

describe("leaseMode transaction: Postgres restart", () => {
  it("survives a Postgres restart mid-batch: the batch is rolled back, counted, and the backlog finished", async () => {
    const dir = await mkdtemp(path.join(tmpdir(), "outbox-txrestart-"));
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
      const deliveries = new Map<string, number[]>();
      const errors: string[] = [];
      let hold: (() => void) | undefined;
      const worker = createWorker({
        ...mode,
        connection: server.url,
        logger: false,
        minPollIntervalMs: 20,
        maxPollIntervalMs: 200,
        loopBackoffBaseMs: 50,
        loopBackoffMaxMs: 300,
        maxConsecutiveFailures: 1000,
        queues: {
          restart: async (payload: unknown, msg) => {
            deliveries.set(msg.id, [...(deliveries.get(msg.id) ?? []), msg.deliveries]);
            // The first row's batch waits, open, until the server is gone.
            if ((payload as { first?: boolean }).first && deliveries.get(msg.id)?.length === 1)
              await new Promise<void>((resolve) => {
                hold = resolve;
              });
          },
        },
      });
      worker.on("loop_error", (e) => errors.push(e.loop));
      await worker.start();
      try {
        const c1 = await producer.connect();
        const [first] = await restartOutbox.publishMany(c1, "restart", [{ payload: { first: true } }]);
        c1.release();
        await until(() => hold !== undefined, "the first batch is running");
        await server.stop();
        hold?.();
        await until(() => errors.length > 0, "the worker notices the outage");
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
        await until(async () => (await left()) === 0, "backlog acknowledged after the restart", 60_000);
        expect(deliveries.size).toBe(31);
        // Rolled back by the restart, the first row was delivered again, and its first delivery counted.
        expect(deliveries.get(first as string)).toEqual([1, 2]);
        expect((await producer.query("SELECT count(*)::int AS n FROM outbox.lease_guards")).rows[0].n).toBe(
          0,
        );
      } finally {
        await worker.stop({ timeoutMs: 2000 });
        await producer.end();
      }
    } finally {
      await server.stop();
      await rm(dir, { recursive: true, force: true });
    }
  }, 300_000);
});
