import pg from "pg";
import pino from "pino";
import { afterEach, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { createMetrics } from "../../src/service/metrics.js";
import { createInboxRetention } from "../../src/worker/inbox-retention.js";
import { resolveWorkerOptions } from "../../src/worker/options.js";
import type { Worker } from "../../src/worker/worker.js";
import { testDatabase } from "../support/database.js";
import { startPostgresProxy, type TcpProxy, throughProxy } from "../support/tcp-proxy.js";
import { nextEvent, publisherFor, until, workerFactory } from "../support/worker.js";

/**
 * The worker inbox (issue 29): a redelivered message whose handler already succeeded is acked without
 * running it again. The record is committed on its own before the ack, so a lost ack leaves it behind.
 */
const db = testDatabase("inbox");
const workers = workerFactory(db);
const outbox = publisherFor(db.schema);
let proxy: TcpProxy;
const pools: pg.Pool[] = [];

beforeAll(() => db.migrate());
beforeEach(async () => {
  await db.pool.query(`TRUNCATE ${db.names.messages}, ${db.names.deadLetters}, ${db.names.inbox}`);
  proxy = await startPostgresProxy(db.url);
});
afterEach(async () => {
  await proxy.close();
  await Promise.all(pools.splice(0).map((p) => p.end().catch(() => {})));
});

/** Statements a pool's connections sent, by text; and hooks on the answers of some. */
interface Watch {
  texts: string[];
  /** Runs after a statement matching `pattern` was answered, before its caller sees the answer. */
  after: { pattern: RegExp; run: () => void }[];
  /** Statements matching this fail at once (as on a broken connection). */
  refuse: RegExp | undefined;
}

type WatchedPool = pg.Pool & Watch;

/**
 * A pool whose every connection reports to one Watch: statements sent through `pool.query` and through a
 * checked-out client (a transaction) alike.
 */
function watchedPool(url: string): WatchedPool {
  // Assigned below, before any connection exists.
  let watch: Watch;
  class WatchedClient extends pg.Client {
    // biome-ignore lint/suspicious/noExplicitAny: pg's query has many overloads; this looks at the text only.
    override query(config: any, ...rest: any[]): any {
      const text = typeof config === "string" ? config : String(config?.text ?? "");
      watch.texts.push(text);
      // pool.query passes a callback; a checked-out client's caller awaits the promise.
      const callback = rest.findIndex((a) => typeof a === "function");
      const query = super.query as (...args: unknown[]) => Promise<unknown> | undefined;
      if (watch.refuse?.test(text)) {
        const error = new Error("refused by the test");
        if (callback < 0) return Promise.reject(error);
        process.nextTick(() => rest[callback](error));
        return undefined;
      }
      const hooks = watch.after.filter((h) => h.pattern.test(text));
      if (hooks.length === 0) return query.call(this, config, ...rest);
      const run = () => {
        for (const h of hooks) h.run();
      };
      if (callback >= 0) {
        const done = rest[callback];
        rest[callback] = (error: unknown, answer: unknown) => {
          if (!error) run();
          done(error, answer);
        };
        return query.call(this, config, ...rest);
      }
      return query.call(this, config, ...rest)?.then((answer) => {
        run();
        return answer;
      });
    }
  }
  const pool: WatchedPool = Object.assign(
    new pg.Pool({ connectionString: url, max: 8, Client: WatchedClient }),
    {
      texts: [],
      after: [],
      refuse: undefined,
    },
  );
  watch = pool;
  pool.on("error", () => {});
  pools.push(pool);
  return pool;
}

const INBOX_INSERT = /INSERT INTO "[a-z0-9_]+"\.inbox/;
const RENEW = /SET lease_expires_at = now\(\)/;

async function publish(queue: string, items: { payload: unknown; key?: string }[]): Promise<string[]> {
  return db.inTransaction((c) =>
    outbox.publishMany(
      c,
      queue,
      items.map((i) => (i.key === undefined ? { payload: i.payload } : { payload: i.payload, key: i.key })),
    ),
  );
}

async function count(table: string): Promise<number> {
  return (await db.pool.query(`SELECT count(*)::int AS n FROM ${table}`)).rows[0].n;
}

/** A worker options fragment for the worker whose ack is lost: short lease, patient loops, no LISTEN. */
const patient = {
  leaseTtlMs: 3000, // queryTimeoutMs defaults to 1000
  heartbeatMs: 1000,
  listen: false,
  loopBackoffBaseMs: 20,
  loopBackoffMaxMs: 200,
  maxConsecutiveFailures: 100_000,
};

async function dedupedCounter(worker: Worker) {
  const metrics = createMetrics({
    pool: db.pool,
    schema: db.schema,
    collectDefault: false,
    logger: pino({ level: "silent" }),
  });
  metrics.observe(worker);
  return async () => {
    const metric = await metrics.registry.getSingleMetric("outbox_messages_deduped_total")?.get();
    return metric?.values.find((v) => v.labels.queue !== undefined)?.value ?? 0;
  };
}

describe("worker inbox", () => {
  it("a lost ack (black-holed after the record landed): the redelivery is acked by another worker without running the handler", async () => {
    const runs: string[] = [];
    const handler = async (_p: unknown, m: { id: string }) => {
      runs.push(m.id);
    };
    const aPool = watchedPool(throughProxy(db.url, proxy));
    // The moment the record's INSERT is answered (committed: it runs on its own), every connection of A
    // goes silent: the ack that follows never reaches Postgres, and the lease can no longer be renewed.
    let recorded = false;
    aPool.after.push({
      pattern: INBOX_INSERT,
      run: () => {
        recorded = true;
        proxy.blackhole();
      },
    });
    await workers.start({ connection: aPool, ...patient, queues: { fx: { handler, inbox: true } } });
    const [id] = await publish("fx", [{ payload: { n: 1 } }]);
    await until(() => recorded, "A's record answered");
    // The black-holed sockets are then reset (as keepalive would, in time): the server ends whatever A
    // had open. Only what A committed stays.
    proxy.cut();
    expect(runs).toEqual([id]);
    expect(await count(db.names.messages)).toBe(1);

    const b = await workers.start({ queues: { fx: { handler, inbox: true } } });
    const deduped = await dedupedCounter(b);
    const events: unknown[] = [];
    b.on("deduped", (e) => events.push(e));
    // A's lease runs out (its heartbeat is black-holed too); B leases the row, finds the record, acks.
    await until(async () => (await count(db.names.messages)) === 0, "B's ack landed", 60_000);
    expect(runs).toEqual([id]);
    expect(events).toEqual([{ id, queue: "fx", consumer: "fx", key: id }]);
    expect(await deduped()).toBe(1);
  });

  it("a slow handler whose lease ran out (the heartbeat could not renew) and whose ack was lost: handled once", async () => {
    const runs: string[] = [];
    let finish!: () => void;
    const gate = new Promise<void>((resolve) => {
      finish = resolve;
    });
    const aPool = watchedPool(throughProxy(db.url, proxy));
    aPool.refuse = RENEW;
    let recorded = false;
    aPool.after.push({
      pattern: INBOX_INSERT,
      run: () => {
        recorded = true;
        proxy.blackhole();
      },
    });
    await workers.start({
      connection: aPool,
      ...patient,
      queues: {
        slow: {
          inbox: true,
          handler: async (_p, m) => {
            await gate;
            runs.push(m.id);
          },
        },
      },
    });
    const [id] = await publish("slow", [{ payload: { n: 1 } }]);
    await until(async () => aPool.texts.some((t) => RENEW.test(t)), "A tried to renew and could not");
    await until(
      async () =>
        (
          await db.pool.query(
            `SELECT 1 FROM ${db.names.messages} WHERE id = $1 AND lease_expires_at < now()`,
            [id],
          )
        ).rowCount === 1,
      "A's lease ran out while its handler ran",
    );
    finish();
    await until(() => recorded, "A's record answered after the handler");
    proxy.cut();

    const b = await workers.start({
      queues: { slow: { inbox: true, handler: async (_p, m) => void runs.push(m.id) } },
    });
    const deduped = await dedupedCounter(b);
    const events: unknown[] = [];
    b.on("deduped", (e) => events.push(e));
    await until(async () => (await count(db.names.messages)) === 0, "B's ack landed", 60_000);
    expect(runs).toEqual([id]);
    expect(events).toEqual([{ id, queue: "slow", consumer: "slow", key: id }]);
    expect(await deduped()).toBe(1);
  });

  it("a derived key: two messages about the same fact run the handler once, the second is deduped", async () => {
    const runs: string[] = [];
    const worker = await workers.start({
      queues: {
        orders: {
          // The ordering key makes the second wait for the first's ack, which comes after its record.
          inbox: { consumer: "mailer", key: (p) => `order-${(p as { order: number }).order}` },
          handler: async (_p, m) => void runs.push(m.id),
        },
      },
    });
    const dedupes: { id: string; consumer: string; key: string }[] = [];
    worker.on("deduped", (e) => dedupes.push(e));
    const [first, second, other] = await publish("orders", [
      { payload: { order: 7 }, key: "order-7" },
      { payload: { order: 7 }, key: "order-7" },
      { payload: { order: 8 }, key: "order-8" },
    ]);
    await until(async () => (await count(db.names.messages)) === 0, "all three completed");
    expect(runs.sort()).toEqual([first, other].sort());
    expect(dedupes).toEqual([{ id: second, queue: "orders", consumer: "mailer", key: "order-7" }]);
    const { rows } = await db.pool.query(
      `SELECT consumer, dedupe_key, message_id::text AS id, queue FROM ${db.names.inbox} ORDER BY dedupe_key`,
    );
    expect(rows).toEqual([
      { consumer: "mailer", dedupe_key: "order-7", id: first, queue: "orders" },
      { consumer: "mailer", dedupe_key: "order-8", id: other, queue: "orders" },
    ]);
  });

  it("a key function that throws or returns no string fails the attempt, and writes no record", async () => {
    const worker = await workers.start({
      queues: {
        badkey: {
          maxAttempts: 1,
          inbox: { key: (p) => (p as { k: unknown }).k as string },
          handler: () => {},
        },
      },
    });
    const [id] = await publish("badkey", [{ payload: { k: 42 } }]);
    const dead = await nextEvent<{ id: string; error: string | null }>(worker, "dead_lettered");
    expect(dead.id).toBe(id);
    expect(dead.error).toContain("inbox.key must return a non-empty string");
    expect(await count(db.names.inbox)).toBe(0);
  });

  it("queues without an inbox run no inbox statement at all", async () => {
    const plain = watchedPool(db.url);
    await workers.start({ connection: plain, queues: { plain: () => {} } });
    await publish(
      "plain",
      Array.from({ length: 20 }, (_, i) => ({ payload: { i } })),
    );
    await until(async () => (await count(db.names.messages)) === 0, "plain queue drained");
    const inboxStatement = /\.inbox\b|expire_inbox/;
    expect(plain.texts.filter((t) => inboxStatement.test(t))).toEqual([]);

    // The same pool's view of a queue with an inbox: the check and the record are seen (the probe works).
    const withInbox = watchedPool(db.url);
    await workers.start({ connection: withInbox, queues: { boxed: { inbox: true, handler: () => {} } } });
    await publish("boxed", [{ payload: 1 }]);
    await until(async () => (await count(db.names.messages)) === 0, "inbox queue drained");
    expect(withInbox.texts.filter((t) => inboxStatement.test(t)).length).toBeGreaterThanOrEqual(2);
  });
});

describe("a brief Postgres outage under a worker with an inbox queue (issue 41.5)", () => {
  it("the worker backs off and carries on: failing inbox checks free slots in a burst, and no freed slot fetches before the backoff ends", async () => {
    // A backlog, so the local queue is full and each fetch fills its batch: freed slots then fetch.
    const seeded = await db.pool.query<{ id: string }>(
      `INSERT INTO ${db.names.messages} (queue, payload) SELECT 'ob', jsonb_build_object('g', g) FROM generate_series(1, 2000) AS g RETURNING id::text AS id`,
    );
    const ids = seeded.rows.map((r) => r.id);
    const handled = new Set<string>();
    const maxConsecutiveFailures = 10;
    const worker = await workers.start({
      connection: throughProxy(db.url, proxy),
      // The default backoff (100 ms doubling to 10 s): 10 failures in a row take 16 s at the least.
      maxConsecutiveFailures,
      queues: { ob: { inbox: true, handler: async (_p, m) => void handled.add(m.id) } },
    });
    let fatal: Error | undefined;
    worker.on("fatal", (e) => {
      fatal = e.error;
    });
    let fetchFailures = 0;
    let completeFailures = 0;
    worker.on("loop_error", (e) => {
      if (e.loop === "fetch") fetchFailures = Math.max(fetchFailures, e.consecutive);
      if (e.loop === "complete") completeFailures = Math.max(completeFailures, e.consecutive);
    });
    await until(() => handled.size >= 200, "deliveries flowing");

    // Postgres gone (every connection reset, new ones refused): the inbox checks of the queued rows fail at
    // once, each a transient retry that frees its slot. Back once the completer, on its own backoff, has
    // failed 4 times in a row (about half a second).
    proxy.cut();
    await until(() => completeFailures >= 4 || fatal !== undefined, "the completer backed off 4 times");
    const failuresDuringOutage = fetchFailures;
    proxy.restore();
    expect(fatal, "the worker gave up during the outage").toBeUndefined();
    expect(failuresDuringOutage, "the outage was seen").toBeGreaterThan(0);
    // Only the backoff timer fetched: a few failures in half a second, far from the threshold.
    expect(failuresDuringOutage).toBeLessThan(maxConsecutiveFailures);

    await expect.poll(() => handled.size, { timeout: 120_000 }).toBe(ids.length);
    await expect.poll(() => count(db.names.messages), { timeout: 60_000 }).toBe(0);
    expect(fatal).toBeUndefined();
    expect(fetchFailures).toBeLessThan(maxConsecutiveFailures);
    expect([...handled].sort()).toEqual([...ids].sort());
  });
});

describe("inbox retention", () => {
  it("deletes records older than the retention in batches and keeps the newer ones", async () => {
    await db.pool.query(
      `INSERT INTO ${db.names.inbox} (consumer, dedupe_key, handled_at, message_id, queue)
       SELECT 'c', 'old-' || i, now() - interval '2 hours' - i * interval '1 second', i, 'q' FROM generate_series(1, 5) AS i
       UNION ALL
       SELECT 'c', 'new-' || i, now() - interval '30 minutes', i, 'q' FROM generate_series(1, 3) AS i`,
    );
    const retention = createInboxRetention({
      pool: () => db.pool,
      names: db.names,
      retentionMs: 3_600_000,
      batchSize: 2,
      pauseMs: 1,
      queryTimeoutMs: 10_000,
      log: pino({ level: "silent" }),
    });
    const run = await retention.runOnce();
    expect(run).toEqual({ deleted: 5, batches: 3 });
    const { rows } = await db.pool.query(`SELECT dedupe_key FROM ${db.names.inbox} ORDER BY 1`);
    expect(rows.map((r) => r.dedupe_key)).toEqual(["new-1", "new-2", "new-3"]);
    await retention.stop();
  });
});

describe("inbox options", () => {
  const base = { connection: "postgres://x@127.0.0.1/x", logger: false as const };
  it("refuse a bad inbox or a retention shorter than two leases, naming the field", () => {
    expect(() =>
      resolveWorkerOptions({ ...base, queues: { q: { handler: () => {}, inbox: "yes" as never } } }),
    ).toThrow(/queues\.q\.inbox: must be true, false or \{ consumer\?, key\? \}/);
    expect(() =>
      resolveWorkerOptions({ ...base, queues: { q: { handler: () => {}, inbox: { key: "id" as never } } } }),
    ).toThrow(/queues\.q\.inbox\.key: must be a function/);
    expect(() =>
      resolveWorkerOptions({ ...base, queues: { q: { handler: () => {}, inbox: { consumer: "" } } } }),
    ).toThrow(/queues\.q\.inbox\.consumer: must be a non-empty string/);
    expect(() =>
      resolveWorkerOptions({ ...base, queues: { q: { handler: () => {}, inbox: true, transaction: true } } }),
    ).toThrow(/queues\.q\.inbox: not with transaction/);
    expect(() =>
      resolveWorkerOptions({
        ...base,
        leaseTtlMs: 60_000,
        inboxRetentionMs: 90_000,
        queues: { q: () => {} },
      }),
    ).toThrow(/inboxRetentionMs: must be at least twice leaseTtlMs \(60000\)/);
  });

  it("default to the queue's name and the message id, kept for 7 days", () => {
    const o = resolveWorkerOptions({
      ...base,
      queues: {
        a: { handler: () => {}, inbox: true },
        b: { handler: () => {}, inbox: { consumer: "c" } },
        p: () => {},
      },
    });
    expect(o.queues.get("a")?.inbox).toEqual({ consumer: "a", key: undefined });
    expect(o.queues.get("b")?.inbox).toEqual({ consumer: "c", key: undefined });
    expect(o.queues.get("p")?.inbox).toBeUndefined();
    expect(o.inboxRetentionMs).toBe(7 * 86_400_000);
  });
});
