import { beforeAll, describe, expect, it } from "vitest";
import { z } from "zod";
import {
  defineTopic,
  listDeadLetters,
  listSubscriptions,
  OutboxConfigError,
  OutboxPayloadError,
  PermanentError,
  replayDeadLetters,
  subscribe,
  subscribersOf,
  TransientError,
  unsubscribe,
} from "../../src/index.js";
import { constant } from "../../src/retry/strategies.js";
import { testDatabase } from "../support/database.js";
import { publisherFor, until, workerFactory } from "../support/worker.js";

/**
 * Topics: one event, one message per subscribed queue, written by the database's fan-out in the producer's
 * transaction (publishToTopic and a plain-SQL INSERT meet there); each subscriber then delivers, retries,
 * orders and dead-letters on its own.
 */
const db = testDatabase("topics");
const workers = workerFactory(db);
const outbox = publisherFor(db.schema);
const schema = db.schema;

beforeAll(() => db.migrate());

async function rows(queue?: string) {
  const { rows } = await db.pool.query<{
    id: string;
    queue: string;
    key: string | null;
    headers: object;
    payload: unknown;
  }>(
    `SELECT id::text, queue, key, headers, payload FROM ${db.names.messages}
     WHERE $1::text IS NULL OR queue = $1 ORDER BY id`,
    [queue ?? null],
  );
  return rows;
}

describe("publishing to a topic", () => {
  it("writes one message per subscribed queue in the producer's transaction; a rollback leaves nothing", async () => {
    await subscribe(db.pool, { schema, topic: "t1.placed", queue: "t1.billing" });
    await subscribe(db.pool, { schema, topic: "t1.placed", queue: "t1.email" });
    const rolledBack = await db.inTransaction(
      (c) => outbox.publishToTopic(c, "t1.placed", { order: 1 }, { key: "o1" }),
      true,
    );
    expect(rolledBack.messages.map((m) => m.queue)).toEqual(["t1.billing", "t1.email"]);
    expect(await rows("t1.billing")).toEqual([]);
    expect(await rows("t1.email")).toEqual([]);
    const dead = await db.pool.query(`SELECT 1 FROM ${db.names.deadLetters} WHERE queue = 't1.placed'`);
    expect(dead.rowCount).toBe(0);

    const event = await db.inTransaction((c) =>
      outbox.publishToTopic(c, "t1.placed", { order: 2 }, { key: "o2", headers: { "x-a": "1" } }),
    );
    const written = await rows();
    expect(written.filter((r) => r.queue.startsWith("t1."))).toEqual([
      {
        id: event.messages[0]?.id,
        queue: "t1.billing",
        key: "o2",
        headers: { "x-a": "1", "outbox-topic": "t1.placed" },
        payload: { order: 2 },
      },
      {
        id: event.messages[1]?.id,
        queue: "t1.email",
        key: "o2",
        headers: { "x-a": "1", "outbox-topic": "t1.placed" },
        payload: { order: 2 },
      },
    ]);
  });

  it("fans a plain-SQL INSERT with `topic` out exactly as publishToTopic does, and stores no row of its own", async () => {
    await subscribe(db.pool, { schema, topic: "t2.placed", queue: "t2.a" });
    await subscribe(db.pool, { schema, topic: "t2.*", queue: "t2.b" });
    const viaApi = await db.inTransaction((c) =>
      outbox.publishToTopic(c, "t2.placed", { n: 1 }, { key: "k" }),
    );
    const inserted = await db.pool.query(
      `INSERT INTO ${db.names.messages} (topic, payload, key) VALUES ('t2.placed', '{"n": 1}', 'k') RETURNING id`,
    );
    expect(inserted.rowCount).toBe(0);
    const copies = (await rows()).filter((r) => r.queue.startsWith("t2."));
    const strip = (r: (typeof copies)[number]) => ({
      queue: r.queue,
      key: r.key,
      headers: r.headers,
      payload: r.payload,
    });
    const api = copies.filter((r) => viaApi.messages.some((m) => m.id === r.id)).map(strip);
    const sql = copies.filter((r) => !viaApi.messages.some((m) => m.id === r.id)).map(strip);
    expect(api).toHaveLength(2);
    expect(sql).toEqual(api);
    const stored = await db.pool.query(`SELECT 1 FROM ${db.names.messages} WHERE topic IS NOT NULL`);
    expect(stored.rowCount).toBe(0);
  });

  it("delivers a category subscription order.* its own events only; # takes any number of segments", async () => {
    await subscribe(db.pool, { schema, topic: "order.*", queue: "t3.orders" });
    await subscribe(db.pool, { schema, topic: "order.#", queue: "t3.deep" });
    expect(await subscribersOf(db.pool, "order.placed", { schema })).toEqual(["t3.deep", "t3.orders"]);
    const seen: { queue: string; topic: string | null }[] = [];
    const handler = async (_p: unknown, m: { queue: string; topic: string | null }) => {
      seen.push({ queue: m.queue, topic: m.topic });
    };
    await workers.start({ queues: { "t3.orders": handler, "t3.deep": handler } });
    await db.inTransaction(async (c) => {
      await outbox.publishToTopic(c, "order.placed", {});
      await outbox.publishToTopic(c, "order.cancelled", {});
      await outbox.publishToTopic(c, "payment.failed", {});
      await outbox.publishToTopic(c, "order.placed.eu", {});
    });
    await until(() => seen.length >= 5, "five deliveries");
    const sorted = [...seen].sort((a, b) => `${a.queue}${a.topic}`.localeCompare(`${b.queue}${b.topic}`));
    expect(sorted).toEqual([
      { queue: "t3.deep", topic: "order.cancelled" },
      { queue: "t3.deep", topic: "order.placed" },
      { queue: "t3.deep", topic: "order.placed.eu" },
      { queue: "t3.orders", topic: "order.cancelled" },
      { queue: "t3.orders", topic: "order.placed" },
    ]);
    // payment.failed had no subscriber: kept, not dropped.
    const kept = await listDeadLetters(db.pool, schema, { queue: "payment.failed" });
    expect(kept.map((d) => d.reason)).toEqual(["no_subscribers"]);
  });

  it("refuses a bad topic, a wildcard topic and the reserved header before any statement, leaving the transaction usable", async () => {
    await db.inTransaction(async (c) => {
      await expect(outbox.publishToTopic(c, "order.*", {})).rejects.toThrow(OutboxConfigError);
      await expect(outbox.publishToTopic(c, "bad topic", {})).rejects.toThrow(/not a topic name/);
      await expect(
        outbox.publishToTopic(c, "t4.x", {}, { headers: { "Outbox-Topic": "forged" } }),
      ).rejects.toThrow(OutboxPayloadError);
      await expect(outbox.publish(c, "t4.q", {}, { headers: { "outbox-topic": "forged" } })).rejects.toThrow(
        /reserved/,
      );
      const typed = defineTopic("t4.typed", z.object({ n: z.number() }));
      await expect(outbox.publishToTopic(c, typed, { n: "x" } as never)).rejects.toThrow(OutboxPayloadError);
      await c.query("SELECT 1");
    });
    await expect(subscribe(db.pool, { schema, topic: "order.*x", queue: "q" })).rejects.toThrow(
      /topic pattern/,
    );
    await expect(
      db.pool.query(`INSERT INTO ${db.names.messages} (topic, payload) VALUES ('a..b', '{}')`),
    ).rejects.toThrow(/not a topic name/);
    await expect(
      db.pool.query(`INSERT INTO ${db.names.messages} (queue, topic, payload) VALUES ('q', 'a.b', '{}')`),
    ).rejects.toThrow(/both queue/);
  });
});

describe("plain-SQL topic rows", () => {
  it("refuses a dedupe_key on a topic row, naming the column, as publishToTopic refuses dedupeKey (test/produce/dedupe-cancel): nothing is written", async () => {
    await subscribe(db.pool, { schema, topic: "t11.placed", queue: "t11.a" });
    const insert = db.pool.query(
      `INSERT INTO ${db.names.messages} (topic, payload, dedupe_key) VALUES ('t11.placed', '{"n": 1}', 'd1')`,
    );
    await expect(insert).rejects.toMatchObject({
      code: "22023",
      message: expect.stringMatching(/dedupe_key/),
    });
    expect(await rows("t11.a")).toEqual([]);
    const kept = await db.pool.query(`SELECT 1 FROM ${db.names.deadLetters} WHERE queue = 't11.placed'`);
    expect(kept.rowCount).toBe(0);
  });

  it("sends every row of one multi-row INSERT to the subscribers committed when it started, though one commits while it runs", async () => {
    await subscribe(db.pool, { schema, topic: "t12.x", queue: "t12.a" });
    const gateKey = 412_012;
    const gate = await db.pool.connect();
    const producer = await db.pool.connect();
    try {
      await gate.query("SELECT pg_advisory_lock($1)", [gateKey]);
      const pid = (await producer.query<{ pid: number }>("SELECT pg_backend_pid() AS pid")).rows[0]?.pid;
      // Row 1 is expanded, then computing row 2 waits on the gate: the statement is halfway through.
      const insert = producer.query(
        `INSERT INTO ${db.names.messages} (topic, payload)
         SELECT 't12.x', jsonb_build_object('n', g, 'gate', CASE WHEN g = 2 THEN pg_advisory_xact_lock_shared($1)::text END)
         FROM generate_series(1, 3) AS g`,
        [gateKey],
      );
      insert.catch(() => {}); // awaited below; a rejection before then is not unhandled
      await until(async () => {
        const waiting = await db.pool.query(
          "SELECT 1 FROM pg_locks WHERE pid = $1 AND locktype = 'advisory' AND NOT granted",
          [pid],
        );
        return waiting.rowCount === 1;
      }, "the INSERT waiting on the gate after its first row");
      expect((await rows("t12.a")).length).toBe(0); // not committed yet: nothing visible
      await subscribe(db.pool, { schema, topic: "t12.x", queue: "t12.b" });
      await gate.query("SELECT pg_advisory_unlock($1)", [gateKey]);
      expect((await insert).rowCount).toBe(0);
    } finally {
      gate.release();
      producer.release();
    }
    const copies = (await rows()).filter((r) => r.queue.startsWith("t12."));
    const byQueue = (q: string) =>
      copies.filter((r) => r.queue === q).map((r) => (r.payload as { n: number }).n);
    expect({ a: byQueue("t12.a"), b: byQueue("t12.b") }).toEqual({ a: [1, 2, 3], b: [] });
  });
});

describe("subscribers are independent", () => {
  it("one retried 3 times, one rejected, one delivered once: each ends its own way", async () => {
    for (const queue of ["t5.flaky", "t5.rejecting", "t5.fine"])
      await subscribe(db.pool, { schema, topic: "t5.placed", queue });
    const runs = { flaky: 0, rejecting: 0, fine: 0 };
    await workers.start({
      retry: constant(10),
      queues: {
        "t5.flaky": async () => {
          runs.flaky++;
          if (runs.flaky <= 3) throw new TransientError("downstream is down");
        },
        "t5.rejecting": async () => {
          runs.rejecting++;
          throw new PermanentError("never");
        },
        "t5.fine": async () => {
          runs.fine++;
        },
      },
    });
    await db.inTransaction((c) => outbox.publishToTopic(c, "t5.placed", { order: 5 }));
    await until(async () => (await rows()).every((r) => !r.queue.startsWith("t5.")), "every copy settled");
    expect(runs).toEqual({ flaky: 4, rejecting: 1, fine: 1 });
    const dead = await listDeadLetters(db.pool, schema, { queue: "t5.rejecting" });
    expect(dead.map((d) => d.reason)).toEqual(["rejected"]);
    expect(await listDeadLetters(db.pool, schema, { queue: "t5.flaky" })).toEqual([]);
    expect(await listDeadLetters(db.pool, schema, { queue: "t5.fine" })).toEqual([]);
  });

  it("keeps each key's events in order within every subscriber", async () => {
    await subscribe(db.pool, { schema, topic: "t6.changed", queue: "t6.a" });
    await subscribe(db.pool, { schema, topic: "t6.#", queue: "t6.b" });
    const seen = new Map<string, number[]>();
    let overlap = 0;
    const running = new Set<string>();
    const handler = async (payload: unknown, m: { queue: string; key: string | null }) => {
      const slot = `${m.queue}/${m.key}`;
      if (running.has(slot)) overlap++;
      running.add(slot);
      await new Promise((resolve) => setImmediate(resolve));
      seen.set(slot, [...(seen.get(slot) ?? []), (payload as { seq: number }).seq]);
      running.delete(slot);
    };
    await workers.start({ concurrency: 8, queues: { "t6.a": handler, "t6.b": handler } });
    for (let seq = 0; seq < 20; seq++) {
      await db.inTransaction((c) =>
        outbox.publishManyToTopic(
          c,
          "t6.changed",
          ["k1", "k2", "k3"].map((key) => ({ payload: { seq }, key })),
        ),
      );
    }
    await until(() => [...seen.values()].reduce((n, s) => n + s.length, 0) >= 120, "120 deliveries");
    expect(overlap).toBe(0);
    for (const slot of ["t6.a/k1", "t6.a/k2", "t6.a/k3", "t6.b/k1", "t6.b/k2", "t6.b/k3"])
      expect(seen.get(slot)).toEqual(Array.from({ length: 20 }, (_, i) => i));
  });
});

describe("concurrent producers of one topic", () => {
  it("never deadlock: a batch takes every subscriber's key locks in (queue, key) order before any row", {
    timeout: 180_000,
  }, async () => {
    for (const queue of ["t9.a", "t9.b", "t9.c"]) await subscribe(db.pool, { schema, topic: "t9.x", queue });
    const errors: unknown[] = [];
    let written = 0;
    await Promise.all(
      [0, 1, 2].map(async (p) => {
        for (let b = p; b < 45; b += 3) {
          // Keys in a different order in every batch: row by row, their locks would be taken crosswise.
          const items = Array.from({ length: 16 }, (_, i) => ({
            payload: { b, i },
            key: `k${(b * 5 + i * 7) % 16}`,
          }));
          try {
            const events = await db.inTransaction((c) => outbox.publishManyToTopic(c, "t9.x", items));
            written += events.reduce((n, e) => n + e.messages.length, 0);
          } catch (error) {
            errors.push(error);
          }
        }
      }),
    );
    expect(errors.map((e) => (e as { code?: string }).code ?? String(e))).toEqual([]);
    expect(written).toBe(45 * 16 * 3);
  });
});

describe("managing subscriptions", () => {
  it("gives a queue that several of its patterns match one copy of each event", async () => {
    for (const topic of ["t10.placed", "t10.*", "t10.#", "#"])
      await subscribe(db.pool, { schema, topic, queue: "t10.q" });
    const event = await db.inTransaction((c) => outbox.publishToTopic(c, "t10.placed", {}));
    await unsubscribe(db.pool, { schema, topic: "#", queue: "t10.q" });
    expect(event.messages.filter((m) => m.queue === "t10.q")).toHaveLength(1);
    expect((await rows("t10.q")).length).toBe(1);
  });

  it("subscribing twice is idempotent; unsubscribing stops new copies and leaves queued ones deliverable", async () => {
    expect(await subscribe(db.pool, { schema, topic: "t7.x", queue: "t7.q" })).toEqual({ created: true });
    expect(await subscribe(db.pool, { schema, topic: "t7.x", queue: "t7.q" })).toEqual({ created: false });
    expect(await listSubscriptions(db.pool, { schema, queue: "t7.q" })).toEqual([
      { topic: "t7.x", queue: "t7.q", createdAt: expect.any(Date) },
    ]);
    await db.inTransaction((c) => outbox.publishToTopic(c, "t7.x", { n: 1 }));
    expect(await unsubscribe(db.pool, { schema, topic: "t7.x", queue: "t7.q" })).toEqual({ removed: true });
    expect(await unsubscribe(db.pool, { schema, topic: "t7.x", queue: "t7.q" })).toEqual({ removed: false });
    const after = await db.inTransaction((c) => outbox.publishToTopic(c, "t7.x", { n: 2 }));
    expect(after.messages).toEqual([]);
    const handled: unknown[] = [];
    await workers.start({ queues: { "t7.q": async (p) => void handled.push(p) } });
    await until(() => handled.length === 1, "the queued copy delivered");
    expect(handled).toEqual([{ n: 1 }]);
    // The event published after the unsubscribe was kept, not lost.
    const kept = await listDeadLetters(db.pool, schema, { queue: "t7.x" });
    expect(kept.map((d) => [d.reason, d.payload])).toEqual([["no_subscribers", { n: 2 }]]);
  });

  it("replays an event kept for want of a subscriber to the queues subscribed by then, and keeps one that still has none", async () => {
    await db.inTransaction(async (c) => {
      await outbox.publishToTopic(c, "t8.late", { n: 1 }, { key: "k" });
      await outbox.publishToTopic(c, "t8.never", { n: 2 });
    });
    const preview = await replayDeadLetters(db.pool, schema, { reason: "no_subscribers" }, { dryRun: true });
    expect(preview.queues.filter((q) => q.queue.startsWith("t8."))).toEqual([
      { queue: "t8.late", replayed: 0, skipped: 1, skippedIds: [expect.any(String)], busy: 0, busyIds: [] },
      { queue: "t8.never", replayed: 0, skipped: 1, skippedIds: [expect.any(String)], busy: 0, busyIds: [] },
    ]);
    await subscribe(db.pool, { schema, topic: "t8.*", queue: "t8.one" });
    await subscribe(db.pool, { schema, topic: "t8.late", queue: "t8.two" });
    await unsubscribe(db.pool, { schema, topic: "t8.*", queue: "t8.one" });
    await subscribe(db.pool, { schema, topic: "t8.late", queue: "t8.one" });
    const result = await replayDeadLetters(db.pool, schema, { reason: "no_subscribers" });
    expect(result.queues.filter((q) => q.queue.startsWith("t8."))).toEqual([
      { queue: "t8.late", replayed: 1, skipped: 0, skippedIds: [], busy: 0, busyIds: [] },
      { queue: "t8.never", replayed: 0, skipped: 1, skippedIds: [expect.any(String)], busy: 0, busyIds: [] },
    ]);
    const copies = (await rows()).filter((r) => r.queue.startsWith("t8."));
    expect(copies.map((r) => [r.queue, r.key, r.headers, r.payload])).toEqual([
      ["t8.one", "k", { "outbox-topic": "t8.late" }, { n: 1 }],
      ["t8.two", "k", { "outbox-topic": "t8.late" }, { n: 1 }],
    ]);
    expect((await listDeadLetters(db.pool, schema, { queue: "t8.late" })).length).toBe(0);
    expect((await listDeadLetters(db.pool, schema, { queue: "t8.never" })).length).toBe(1);
  });
});
