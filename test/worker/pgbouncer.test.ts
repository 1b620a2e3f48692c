/**
 * Invariant 13: everything works through PgBouncer in transaction mode (no startup parameters, no named
 * prepared statements that outlive a transaction), with LISTEN degraded to a latency hint (invariant 4);
 * in session mode everything, LISTEN included, works as it does directly. A real PgBouncer process sits in
 * front of the test database; the schema is migrated directly, never through the pooler.
 */
import path from "node:path";
import pg from "pg";
import pino from "pino";
import { afterEach, beforeAll, describe, expect, it } from "vitest";
import { createPgLeaseStore } from "../../src/lease/pg-store.js";
import type { ListenerState } from "../../src/notify/notifier.js";
import { createPublisher, type Publisher } from "../../src/produce/publisher.js";
import type { WorkerEvents } from "../../src/worker/events.js";
import type { WorkerOptions } from "../../src/worker/options.js";
import { createWorker, type Worker } from "../../src/worker/worker.js";
import { type CliProcess, startCli } from "../support/cli-process.js";
import { testDatabase } from "../support/database.js";
import { pgbouncerForTests } from "../support/pgbouncer.js";
import { until } from "../support/worker.js";

const db = testDatabase("pgb");
const tx = await pgbouncerForTests("pgbouncer.test", db.url, { poolMode: "transaction" });
const session = await pgbouncerForTests("pgbouncer.test", db.url, { poolMode: "session" });
// One server connection for every client: each transaction lands where another client's statements are.
const txOneServer = await pgbouncerForTests("pgbouncer.test", db.url, {
  poolMode: "transaction",
  settings: { default_pool_size: 1 },
});

beforeAll(() => db.migrate());

/** What the transaction pooler answers when named prepared statements meet the wrong server connection. */
const POOLER_STATEMENT_ERRORS = new Set(["26000", "42P05"]);
const LISTEN_FALLBACK = "LISTEN gets no notifications";
const PREPARED_SWITCH = "named prepared statements are lost";
const UNNAMED_FROM_START = "statements are unnamed from the start";

interface LogLine {
  level: number;
  msg: string;
  [field: string]: unknown;
}

/** A pino logger writing JSON lines into memory. */
function memoryLogger() {
  const lines: LogLine[] = [];
  const logger = pino({ level: "info" }, { write: (line: string) => void lines.push(JSON.parse(line)) });
  return { logger, lines, warnings: () => lines.filter((l) => l.level >= 40) };
}

interface Observed {
  worker: Worker;
  lines: LogLine[];
  warnings(): LogLine[];
  loopErrors: WorkerEvents["loop_error"][];
  listener: ListenerState[];
  acked: Set<string>;
}

const workers: Worker[] = [];
afterEach(async () => {
  await Promise.all(workers.splice(0).map((w) => w.stop({ timeoutMs: 2000 }).catch(() => {})));
});

/** A worker whose events and log are recorded from before start(). */
async function startObserved(options: Partial<WorkerOptions> & Pick<WorkerOptions, "queues" | "connection">) {
  const log = memoryLogger();
  const worker = createWorker({
    schema: db.schema,
    logger: log.logger,
    minPollIntervalMs: 20,
    maxPollIntervalMs: 200,
    ...options,
  });
  workers.push(worker);
  const observed: Observed = {
    worker,
    lines: log.lines,
    warnings: log.warnings,
    loopErrors: [],
    listener: [],
    acked: new Set(),
  };
  worker.on("loop_error", (e) => observed.loopErrors.push(e));
  worker.on("listener", (e) => observed.listener.push(e.state));
  worker.on("acked", (e) => observed.acked.add(e.id));
  await worker.start();
  return observed;
}

async function remaining(queue: string): Promise<number> {
  const { rows } = await db.pool.query(
    `SELECT count(*)::int AS n FROM ${db.names.messages} WHERE queue = $1`,
    [queue],
  );
  return rows[0].n;
}

/** Published directly (not through the pooler), in a few large statements. */
async function backlog(queue: string, n: number): Promise<string[]> {
  const direct = createPublisher({ schema: db.schema, notify: false });
  const ids: string[] = [];
  for (let from = 0; from < n; from += 1000) {
    const items = Array.from({ length: Math.min(1000, n - from) }, (_, i) => ({ payload: { i: from + i } }));
    ids.push(...(await db.inTransaction((c) => direct.publishMany(c, queue, items))));
  }
  return ids;
}

/** A handler that counts each id it is handed. */
function ledger() {
  const seen = new Map<string, number>();
  return {
    seen,
    handler: (_payload: unknown, message: { id: string }) => {
      seen.set(message.id, (seen.get(message.id) ?? 0) + 1);
    },
    /** Ids handled other than exactly once, with their counts. */
    notOnce: () => [...seen].filter(([, n]) => n !== 1),
  };
}

const codeOf = (error: unknown) => String((error as { code?: unknown }).code ?? "none");

/** Waits for the ledger to hold `ids` and the queue to be empty; on a timeout, says what the worker saw. */
async function drained(w: Observed, seen: Map<string, number>, ids: string[], queue: string) {
  try {
    await until(
      async () => ids.every((id) => seen.has(id)) && (await remaining(queue)) === 0,
      `${ids.length} rows handled and deleted`,
      60_000,
    );
  } catch (error) {
    const errors = w.loopErrors.slice(-3).map((e) => `${e.loop}: ${codeOf(e.error)} ${e.error.message}`);
    throw new Error(
      `${(error as Error).message}; handled ${seen.size}, left ${await remaining(queue)}, ` +
        `${w.loopErrors.length} loop errors, the last: ${JSON.stringify(errors)}`,
    );
  }
}

/**
 * `producers` connections through `url`, each running `perProducer` transactions of BEGIN, publish,
 * COMMIT one after another. Returns the committed ids and every failure as "SQLSTATE message".
 */
async function produce(
  url: string,
  publisher: Publisher,
  queue: string,
  producers: number,
  perProducer: number,
) {
  const ids: string[] = [];
  const failures: string[] = [];
  await Promise.all(
    Array.from({ length: producers }, async (_, p) => {
      const client = new pg.Client({ connectionString: url });
      client.on("error", () => {});
      await client.connect();
      try {
        for (let i = 0; i < perProducer; i++) {
          try {
            await client.query("BEGIN");
            const id = await publisher.publish(client, queue, { producer: p, i });
            await client.query("COMMIT");
            ids.push(id);
          } catch (error) {
            failures.push(`${codeOf(error)} ${(error as Error).message}`);
            await client.query("ROLLBACK").catch(() => {});
          }
        }
      } finally {
        await client.end().catch(() => {});
      }
    }),
  );
  return { ids, failures };
}

async function present(ids: string[]): Promise<number> {
  const { rows } = await db.pool.query(
    `SELECT count(*)::int AS n FROM ${db.names.messages} WHERE id = ANY($1::bigint[])`,
    [ids],
  );
  return rows[0].n;
}

describe.skipIf(tx.skip !== undefined)("PgBouncer, transaction mode", () => {
  const url = tx.bouncer?.url ?? "";

  it("8 producers × 200 publish transactions through the pooler: no failure, every row committed", async () => {
    const queue = "pgb.produce";
    // The defaults: unnamed statements, the in-transaction wake-up notification.
    const { ids, failures } = await produce(url, createPublisher({ schema: db.schema }), queue, 8, 200);
    expect(failures).toEqual([]);
    expect(ids).toHaveLength(1600);
    expect(new Set(ids).size).toBe(1600);
    expect(await present(ids)).toBe(1600);
    expect(await remaining(queue)).toBe(1600);
    await db.pool.query(`DELETE FROM ${db.names.messages} WHERE queue = $1`, [queue]);
  });

  it.skipIf(txOneServer.skip !== undefined)(
    "8 producers with preparedStatements: true fail (what the default avoids)",
    async () => {
      const queue = "pgb.produce-named";
      const publisher = createPublisher({ schema: db.schema, preparedStatements: true });
      // Through a pooler with one server connection the race is certain, not left to the machine's timing:
      // the first producer prepares the statement there, and each other one's first Parse of it finds it.
      const { ids, failures } = await produce(txOneServer.bouncer?.url ?? "", publisher, queue, 8, 25);
      // A statement prepared on one server connection is missing (26000) or already there (42P05) on the next.
      expect(failures.length).toBeGreaterThanOrEqual(7);
      expect(failures.filter((f) => !POOLER_STATEMENT_ERRORS.has(f.slice(0, 5)))).toEqual([]);
      // Each committed id is there; a failed transaction left nothing.
      expect(await present(ids)).toBe(ids.length);
      expect(await remaining(queue)).toBe(ids.length);
      await db.pool.query(`DELETE FROM ${db.names.messages} WHERE queue = $1`, [queue]);
    },
  );

  it("a worker with preparedStatements: false drains 5,000 rows exactly once, polling, with one warning", async () => {
    const queue = "pgb.drain";
    const ids = await backlog(queue, 5000);
    const handled = ledger();
    const w = await startObserved({
      connection: url,
      preparedStatements: false,
      queues: { [queue]: handled.handler },
    });
    await drained(w, handled.seen, ids, queue);
    expect(handled.notOnce()).toEqual([]);
    expect([...handled.seen.keys()].sort()).toEqual([...ids].sort());
    expect(w.loopErrors.map((e) => `${e.loop}: ${codeOf(e.error)} ${e.error.message}`)).toEqual([]);
    // LISTEN through a transaction pooler never delivers: the self-test notices and polling takes over.
    expect(w.listener.at(-1)).toBe("poll_only");
    expect(w.warnings().map((l) => l.msg)).toEqual([expect.stringContaining(LISTEN_FALLBACK)]);
    const [warning] = w.warnings();
    expect(warning?.msg).toContain("PgBouncer");
    expect(warning?.msg).toContain("minPollIntervalMs (20 ms)");
  });

  it("a worker left on prepared statements knows the pooler before its first statement: 5,000 rows, no error", async () => {
    const queue = "pgb.drain-named";
    const ids = await backlog(queue, 5000);
    const handled = ledger();
    const w = await startObserved({ connection: url, queues: { [queue]: handled.handler } });
    await drained(w, handled.seen, ids, queue);
    expect(handled.notOnce()).toEqual([]);
    expect([...handled.seen.keys()].sort()).toEqual([...ids].sort());
    // Found by the probes at start: not one named statement reached the pooler.
    expect(w.loopErrors.map((e) => `${e.loop}: ${codeOf(e.error)} ${e.error.message}`)).toEqual([]);
    expect(w.lines.filter((l) => l.level >= 50)).toEqual([]);
    expect(w.lines.filter((l) => l.msg.includes(PREPARED_SWITCH))).toEqual([]);
    const unnamed = w.lines.filter((l) => l.msg.includes(UNNAMED_FROM_START));
    expect(unnamed.map((l) => l.level)).toEqual([30]);
    expect(unnamed[0]?.reason).toContain("transaction-mode pooler");
    // The one warning is LISTEN's: wake-ups are off behind this pooler.
    expect(w.warnings().map((l) => l.msg)).toEqual([expect.stringContaining(LISTEN_FALLBACK)]);
    expect(w.listener.at(-1)).toBe("poll_only");
  });

  it('leaseMode "transaction" through the pooler: 5,000 rows exactly once, each batch held by its transaction, no error', async () => {
    const queue = "pgb.drain-tx";
    const ids = await backlog(queue, 5000);
    const handled = ledger();
    const w = await startObserved({
      connection: url,
      leaseMode: "transaction",
      queues: { [queue]: handled.handler },
    });
    await drained(w, handled.seen, ids, queue);
    expect(handled.notOnce()).toEqual([]);
    expect([...handled.seen.keys()].sort()).toEqual([...ids].sort());
    // The batch's transaction stays on one server connection (transaction pooling), its guard on another.
    expect(w.loopErrors.map((e) => `${e.loop}: ${codeOf(e.error)} ${e.error.message}`)).toEqual([]);
    expect(w.lines.filter((l) => l.level >= 50)).toEqual([]);
    expect(w.lines.filter((l) => l.msg.includes(PREPARED_SWITCH))).toEqual([]);
    const guards = await db.pool.query(
      `SELECT count(*)::int AS n FROM ${db.names.quotedSchema}.lease_guards`,
    );
    expect(guards.rows[0].n).toBe(0);
  });

  it("with LISTEN at the database, the pool's own probe finds the pooler: 2,000 rows, no error", async () => {
    const queue = "pgb.drain-listen-direct";
    const ids = await backlog(queue, 2000);
    const handled = ledger();
    const w = await startObserved({
      connection: url,
      listenConnection: db.url,
      queues: { [queue]: handled.handler },
    });
    expect(w.listener.at(-1)).toBe("listening");
    await drained(w, handled.seen, ids, queue);
    expect(handled.notOnce()).toEqual([]);
    expect(w.loopErrors.map((e) => `${e.loop}: ${codeOf(e.error)} ${e.error.message}`)).toEqual([]);
    expect(w.warnings()).toEqual([]);
    const unnamed = w.lines.filter((l) => l.msg.includes(UNNAMED_FROM_START));
    expect(unnamed).toHaveLength(1);
    expect(unnamed[0]?.reason).toContain("a connection pooler answers for the server");
  });

  it.skipIf(txOneServer.skip !== undefined)(
    "a named statement lost later still switches the store to unnamed ones, once, and the retry goes through",
    async () => {
      const queue = "pgb.store-lost";
      const ids = await backlog(queue, 20);
      const pool = new pg.Pool({ connectionString: txOneServer.bouncer?.url ?? "", max: 2 });
      pool.on("error", () => {});
      const lost: unknown[] = [];
      const store = createPgLeaseStore({
        pool: () => pool,
        names: db.names,
        queues: [queue],
        workerId: "pgb-store",
        leaseTtlMs: 30_000,
        maxErrorLength: 1000,
        synchronousCommit: true,
        preparedStatements: true,
        queryTimeoutMs: 10_000,
        onPreparedLost: (error) => lost.push(error),
      });
      try {
        // Two connections of the pool, one server connection behind the pooler: the second Parse of the
        // fetch statement finds the first one's there (42P05), which no retry of a named statement fixes.
        const first = await Promise.allSettled([store.lease(5, 1 << 20), store.lease(5, 1 << 20)]);
        const failed = first.filter((r) => r.status === "rejected").map((r) => codeOf(r.reason));
        expect(failed.length).toBeGreaterThan(0);
        expect(failed.filter((code) => !POOLER_STATEMENT_ERRORS.has(code))).toEqual([]);
        expect(lost).toHaveLength(1);
        expect(store.useUnnamedStatements()).toBe(false);
        // From now on unnamed: every row is leased and acked through the pooler.
        let leased = first.flatMap((r) => (r.status === "fulfilled" ? r.value.rows : []));
        for (let round = 0; round < 10 && leased.length < ids.length; round++) {
          const more = await Promise.all([store.lease(5, 1 << 20), store.lease(5, 1 << 20)]);
          leased = [...leased, ...more.flatMap((l) => l.rows)];
          await Promise.all(
            more.map((l) =>
              store.ack(
                l.rows.map((row) => ({
                  held: { id: row.id, token: l.token, key: row.key, queue: row.queue },
                })),
              ),
            ),
          );
        }
        expect(new Set(leased.map((row) => row.id))).toEqual(new Set(ids));
        expect(lost).toHaveLength(1);
      } finally {
        await pool.end();
      }
    },
  );

  describe("the service", () => {
    const running: CliProcess[] = [];
    afterEach(() => {
      for (const p of running.splice(0)) if (p.child.exitCode === null) p.child.kill("SIGKILL");
    });

    it("outbox-worker run with DATABASE_URL at the pooler, settings left as they are, delivers and logs no error", async () => {
      const p = startCli(["run", "--handlers", path.resolve("test/support/fixtures/handlers.ts")], {
        DATABASE_URL: url,
        OUTBOX_SCHEMA: db.schema,
        OUTBOX_LOG_PRETTY: "false",
        OUTBOX_MIN_POLL_INTERVAL_MS: "20",
        OUTBOX_MAX_POLL_INTERVAL_MS: "200",
      });
      running.push(p);
      await p.waitFor("outbox-worker running");
      await backlog("fast", 200);
      await until(async () => (await remaining("fast")) === 0, "200 rows delivered by the service").catch(
        (error: Error) => {
          throw new Error(
            `${error.message}; its last lines:\n${p.output().trim().split("\n").slice(-3).join("\n")}`,
          );
        },
      );
      p.child.kill("SIGTERM");
      expect(await p.exited, p.output()).toEqual({ code: 0, signal: null });
      const lines = p
        .output()
        .trim()
        .split("\n")
        .map((l) => JSON.parse(l) as LogLine);
      expect(lines.filter((l) => l.msg.includes(LISTEN_FALLBACK)).map((l) => l.level)).toEqual([40]);
      expect(lines.filter((l) => l.msg.includes(PREPARED_SWITCH) || l.msg.includes("backing off"))).toEqual(
        [],
      );
      expect(lines.filter((l) => l.level >= 50)).toEqual([]);
      expect(lines.filter((l) => l.msg.includes(UNNAMED_FROM_START))).toHaveLength(1);
    });

    it("OUTBOX_LISTEN_URL at the database gives the service its wake-ups back behind the pooler", async () => {
      const p = startCli(["run", "--handlers", path.resolve("test/support/fixtures/handlers.ts")], {
        DATABASE_URL: url,
        OUTBOX_LISTEN_URL: db.url,
        OUTBOX_SCHEMA: db.schema,
        OUTBOX_PREPARED_STATEMENTS: "false",
        OUTBOX_LOG_PRETTY: "false",
        // So slow that only a wake-up can explain a delivery at all.
        OUTBOX_MIN_POLL_INTERVAL_MS: "3600000",
        OUTBOX_MAX_POLL_INTERVAL_MS: "3600000",
      });
      running.push(p);
      await p.waitFor("listener listening");
      // Published through the pooler, as the app's producers do: the commit's NOTIFY reaches the direct listener.
      const producer = new pg.Client({ connectionString: url });
      await producer.connect();
      try {
        await producer.query("BEGIN");
        await createPublisher({ schema: db.schema, notify: { cooldownMs: 0 } }).publish(producer, "fast", {});
        await producer.query("COMMIT");
      } finally {
        await producer.end();
      }
      await until(async () => (await remaining("fast")) === 0, "the row delivered on its wake-up", 60_000);
      p.child.kill("SIGTERM");
      expect(await p.exited, p.output()).toEqual({ code: 0, signal: null });
      expect(p.output()).not.toContain(LISTEN_FALLBACK);
    });
  });
});

describe.skipIf(session.skip !== undefined)("PgBouncer, session mode", () => {
  const url = session.bouncer?.url ?? "";

  it("LISTEN works: the listener is listening and a published row is picked up on its wake-up", async () => {
    const queue = "pgb.wake";
    const publisher = createPublisher({ schema: db.schema });
    const publishOne = async (payload: unknown) => {
      const client = new pg.Client({ connectionString: url });
      await client.connect();
      try {
        await client.query("BEGIN");
        const id = await publisher.publish(client, queue, payload);
        await client.query("COMMIT");
        return id;
      } finally {
        await client.end();
      }
    };
    // Before the worker starts, so that its first fetch finds it: after that fetch the next poll is an
    // hour away, and only a wake-up explains a pickup at all.
    const primer = await publishOne({ n: 0 });
    const w = await startObserved({
      connection: url,
      minPollIntervalMs: 3_600_000,
      maxPollIntervalMs: 3_600_000,
      queues: { [queue]: () => {} },
    });
    expect(w.listener).toEqual(["connecting", "listening"]);
    await until(() => w.acked.has(primer), "the primer row, found by the first fetch", 60_000);

    const id = await publishOne({ n: 1 });
    await until(() => w.acked.has(id), "the row published after the first fetch, woken by NOTIFY", 60_000);
    expect(w.loopErrors).toEqual([]);
    expect(w.warnings()).toEqual([]);
    expect(w.listener.at(-1)).toBe("listening");
    // A session-mode pooler keeps each connection's statements: LISTEN through it vouches for that.
    expect(w.lines.filter((l) => l.msg.includes(UNNAMED_FROM_START))).toEqual([]);
  });
});
