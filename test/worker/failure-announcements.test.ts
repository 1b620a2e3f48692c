import { randomUUID } from "node:crypto";
import { beforeAll, beforeEach, describe, expect, it } from "vitest";
import { z } from "zod";
import { defineQueue, handle, PermanentError, type QueueConfig } from "../../src/index.js";
import { replayDeadLetters } from "../../src/inspect/dead-letters.js";
import { loadServiceConfig } from "../../src/service/config.js";
import { completeStatements } from "../../src/sql/complete.js";
import { expireDeadLettersStatement } from "../../src/sql/dead-letters.js";
import { runQuery } from "../../src/sql/executor.js";
import { subscribe } from "../../src/subscribe/subscriptions.js";
import { testHandler } from "../../src/testing/index.js";
import { resolveWorkerOptions } from "../../src/worker/options.js";
import { listen, testDatabase } from "../support/database.js";
import { publisherFor, until, workerFactory } from "../support/worker.js";

/** Failure announcements (issue 29, item 5): a dead-letter move also publishes a failure event. */

const db = testDatabase("fann");
const workers = workerFactory(db);
const outbox = publisherFor(db.schema);

beforeAll(async () => {
  await db.migrate();
});
beforeEach(async () => {
  await db.pool.query(`TRUNCATE ${db.names.messages}, ${db.names.deadLetters}, ${db.names.subscriptions}`);
});

const count = async (where: string) =>
  (await db.pool.query(`SELECT count(*)::int AS n FROM ${db.names.messages} WHERE ${where}`)).rows[0]
    .n as number;

const reject: QueueConfig["handler"] = () => {
  throw new PermanentError("card declined: password=hunter2 redacted upstream");
};

describe("a queue with announceFailures", () => {
  it("publishes the dead letter's data to the named queue, with the trace and a header naming the failure", async () => {
    const wake = await listen(db.url, db.names.channel);
    try {
      const traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
      const [id] = await db.inTransaction((c) =>
        outbox.publishMany(c, "orders", [{ payload: { n: 1 }, key: "customer-7", headers: { traceparent } }]),
      );
      await workers.start({
        queues: { orders: { handler: reject, maxAttempts: 1, announceFailures: { queue: "failures" } } },
      });
      await until(async () => (await count("queue = 'failures'")) === 1, "the failure event");
      await until(() => wake.received.includes("failures"), "the failures queue woken");
      const { rows } = await db.pool.query(
        `SELECT m.payload, m.headers, m.key, dl.dead_at, dl.error
         FROM ${db.names.messages} AS m, ${db.names.deadLetters} AS dl WHERE m.queue = 'failures' AND dl.id = $1`,
        [id],
      );
      const [row] = rows;
      expect(row.key).toBeNull();
      expect(row.headers).toEqual({ "outbox-failure-of": id, traceparent });
      expect(row.payload).toEqual({
        id,
        queue: "orders",
        reason: "rejected",
        error: row.error,
        attempts: 1,
        deliveries: 1,
        key: "customer-7",
        headers: { traceparent },
        failedAt: expect.any(String),
      });
      expect(new Date(row.payload.failedAt).getTime()).toBe(row.dead_at.getTime());
    } finally {
      await wake.close();
    }
  });

  it("announces every kind of move: invalid payload, retries exhausted, max deliveries", async () => {
    const strict = defineQueue("strict", z.object({ n: z.number() }));
    await db.inTransaction(async (c) => {
      await outbox.publish(c, "strict", { n: 1 });
      await db.pool.query(
        `INSERT INTO ${db.names.messages} (queue, payload) VALUES ('strict', '{"n": "x"}'), ('flaky', '{}')`,
      );
      await outbox.publish(c, "crashy", {});
    });
    // A row whose earlier deliveries all ended without an outcome (crashes): dead before it runs again.
    await db.pool.query(`UPDATE ${db.names.messages} SET deliveries_count = 25 WHERE queue = 'crashy'`);
    const announce = { announceFailures: { queue: "failures" } } as const;
    await workers.start({
      queues: {
        strict: handle(strict, () => {}, announce),
        flaky: {
          handler: () => {
            throw new Error("down");
          },
          maxAttempts: 1,
          ...announce,
        },
        crashy: { handler: () => {}, ...announce },
      },
    });
    await until(async () => (await count("queue = 'failures'")) === 3, "three failure events");
    const { rows } = await db.pool.query(
      `SELECT payload ->> 'queue' AS queue, payload ->> 'reason' AS reason FROM ${db.names.messages}
       WHERE queue = 'failures' ORDER BY 1`,
    );
    expect(rows).toEqual([
      { queue: "crashy", reason: "max_deliveries" },
      { queue: "flaky", reason: "retries_exhausted" },
      { queue: "strict", reason: "invalid_payload" },
    ]);
    // The valid one is acked: its ack lands in a batch of its own, maybe after the three moves.
    await until(async () => (await count("queue = 'strict'")) === 0, "the valid strict message acked");
  });

  it("keyed: the key's next message is still promoted and handled after a move with announcement", async () => {
    await db.inTransaction((c) =>
      outbox.publishMany(c, "keyed", [
        { payload: { fail: true }, key: "k" },
        { payload: { fail: false }, key: "k" },
        { payload: { fail: true }, key: "j" },
      ]),
    );
    const handled: unknown[] = [];
    await workers.start({
      queues: {
        keyed: {
          handler: (p) => {
            if ((p as { fail: boolean }).fail) throw new PermanentError("no");
            handled.push(p);
          },
          announceFailures: { queue: "failures" },
        },
      },
    });
    await until(async () => (await count("queue = 'keyed'")) === 0, "the key drained");
    expect(handled).toEqual([{ fail: false }]);
    expect(await count("queue = 'failures'")).toBe(2);
  });

  it("to a topic: each subscriber gets a copy, with the topic header; a subscriber's copy names its topic", async () => {
    await subscribe(db.pool, { schema: db.schema, topic: "payment.failed", queue: "alerts" });
    await subscribe(db.pool, { schema: db.schema, topic: "payment.*", queue: "audit" });
    await subscribe(db.pool, { schema: db.schema, topic: "order.placed", queue: "billing" });
    await db.inTransaction((c) => outbox.publishToTopic(c, "order.placed", { n: 1 }));
    await workers.start({
      queues: { billing: { handler: reject, announceFailures: { topic: "payment.failed" } } },
    });
    await until(async () => (await count("queue IN ('alerts', 'audit')")) === 2, "a copy per subscriber");
    const { rows } = await db.pool.query(
      `SELECT queue, payload ->> 'queue' AS of, payload ->> 'topic' AS topic, headers ->> 'outbox-topic' AS header
       FROM ${db.names.messages} WHERE queue IN ('alerts', 'audit') ORDER BY queue`,
    );
    expect(rows).toEqual([
      { queue: "alerts", of: "billing", topic: "order.placed", header: "payment.failed" },
      { queue: "audit", of: "billing", topic: "order.placed", header: "payment.failed" },
    ]);
  });

  it("replay and retention publish nothing; a queue without the option announces nothing", async () => {
    await db.inTransaction(async (c) => {
      await outbox.publish(c, "orders", { n: 1 });
      await outbox.publish(c, "quiet", { n: 2 });
    });
    const worker = await workers.start({
      queues: {
        orders: { handler: reject, announceFailures: { queue: "failures" } },
        quiet: reject,
      },
    });
    await until(async () => (await count("queue IN ('orders', 'quiet')")) === 0, "both dead");
    await worker.stop();
    expect(await count("queue = 'failures'")).toBe(1);
    await db.pool.query(`DELETE FROM ${db.names.messages} WHERE queue = 'failures'`);
    expect((await replayDeadLetters(db.pool, db.schema, { all: true })).replayed).toBe(2);
    expect(await count("queue = 'failures'")).toBe(0);
    await db.pool.query(`DELETE FROM ${db.names.messages}`);
    await db.pool.query(`UPDATE ${db.names.deadLetters} SET dead_at = now() - interval '2 days'`);
    await db.pool.query(
      `INSERT INTO ${db.names.deadLetters} (id, queue, payload, headers, created_at, available_at, deliveries_count, attempts_count, dead_at, reason)
       VALUES (900001, 'orders', '{}', '{}', now(), now(), 1, 1, now() - interval '2 days', 'rejected')`,
    );
    const expired = await runQuery(db.pool, expireDeadLettersStatement(db.names), {
      olderThanMs: 86_400_000,
      limit: 10,
    });
    expect(expired).toEqual([{ queue: "orders", deleted: 1 }]);
    expect(await count("true")).toBe(0);
  });
});

describe("dead_letter_announced", () => {
  it("announces only the deliveries it moved: a lease taken over, or a busy head, announces nothing", async () => {
    const complete = completeStatements(db.names, { synchronousCommit: true });
    const ids = await db.inTransaction((c) =>
      outbox.publishMany(c, "orders", [
        { payload: { n: 1 } },
        { payload: { n: 2 }, key: "busy" },
        { payload: { n: 3 } },
      ]),
    );
    const token = randomUUID();
    await db.pool.query(
      `UPDATE ${db.names.messages} SET acquired_token = $1, acquired_at = now(), lease_expires_at = now() + interval '1 hour'`,
      [token],
    );
    const move = (tokens: string[]) =>
      db.inTransaction((c) =>
        runQuery(c, complete.deadAnnounced, {
          ids,
          tokens,
          reasons: ids.map(() => "rejected"),
          errors: ids.map(() => "no"),
          attempted: ids.map(() => 1),
          failed: ids.map(() => 1),
          maxErrorLength: 100,
          announceQueues: ids.map(() => "failures"),
          announceTopics: ids.map(() => null),
          channel: db.names.channel,
        }),
      );
    // An older dead letter of the first row (one a replay skipped because the row was back in messages):
    // the event must follow this move, not whatever dead letter the id has.
    await db.pool.query(
      `INSERT INTO ${db.names.deadLetters} (id, queue, payload, headers, created_at, available_at, deliveries_count, attempts_count, dead_at, reason)
       VALUES ($1, 'orders', '{}', '{}', now(), now(), 1, 1, now(), 'rejected')`,
      [ids[0]],
    );
    // A producer of the key holds its lock: the keyed head stays (busy); the first row's lease is not ours.
    const producer = await db.pool.connect();
    try {
      await producer.query("BEGIN");
      await producer.query("SELECT pg_advisory_xact_lock(hashtext('orders'), hashtext('busy'))");
      const [row] = await move([randomUUID(), token, token]);
      expect(row?.busy).toEqual([`${ids[1]}/${token}`]);
      expect(row?.keys).toEqual([`${ids[2]}/${token}`]);
    } finally {
      await producer.query("ROLLBACK");
      producer.release();
    }
    const events = await db.pool.query(
      `SELECT payload ->> 'id' AS id FROM ${db.names.messages} WHERE queue = 'failures'`,
    );
    expect(events.rows).toEqual([{ id: ids[2] }]);
  });
});

describe("announceFailures options", () => {
  const base = { connection: "postgres://x@localhost/db", queues: {} };
  const problem = (queues: Record<string, unknown>) => {
    try {
      resolveWorkerOptions({ ...base, queues } as never);
    } catch (error) {
      return (error as Error).message;
    }
    return "accepted";
  };
  it("refuses the queue itself, a topic it subscribes to, and bad names, naming the field", () => {
    expect(problem({ a: { handler: reject, announceFailures: { queue: "a" } } })).toContain(
      "queues.a.announceFailures.queue: must not be the queue itself",
    );
    expect(
      problem({ a: { handler: reject, subscribe: ["pay.*"], announceFailures: { topic: "pay.failed" } } }),
    ).toContain('queues.a.announceFailures.topic: must not be a topic this queue subscribes to ("pay.*")');
    expect(problem({ a: { handler: reject, announceFailures: { queue: "bad name" } } })).toContain(
      "queues.a.announceFailures.queue:",
    );
    expect(problem({ a: { handler: reject, announceFailures: { topic: "pay.*" } } })).toContain(
      "queues.a.announceFailures.topic:",
    );
    expect(problem({ a: { handler: reject, announceFailures: "failures" } })).toContain(
      'queues.a.announceFailures: must be { queue: "name" } or { topic: "name" }',
    );
    expect(problem({ a: { handler: reject, announceFailures: { queue: "b" } } })).toBe("accepted");
  });
});

describe("a relay's announceFailures in the service config", () => {
  const load = async (relay: Record<string, unknown>) => {
    try {
      const config = await loadServiceConfig({
        env: {},
        overrides: { relays: { "hooks.orders": { type: "http", url: "http://127.0.0.1:1/x", ...relay } } },
      });
      return config.relays["hooks.orders"]?.announceFailures;
    } catch (error) {
      return (error as Error).message;
    }
  };
  it("is taken as a queue or a topic, and refused naming the field when wrong", async () => {
    expect(await load({ announceFailures: { topic: "hooks.failed" } })).toEqual({ topic: "hooks.failed" });
    expect(await load({ announceFailures: { queue: "hooks.orders" } })).toContain(
      "relays.hooks.orders.announceFailures.queue: must not be the relay's own queue",
    );
    expect(await load({ announceFailures: { topic: "hooks.*" } })).toContain(
      "relays.hooks.orders.announceFailures",
    );
  });
});

describe("the test harness", () => {
  it("says where a dead letter's failure is announced", async () => {
    const run = testHandler({ handler: reject, announceFailures: { topic: "orders.failed" } });
    expect(await run({})).toMatchObject({
      kind: "dead",
      reason: "rejected",
      announced: { topic: "orders.failed" },
    });
    expect(await testHandler(reject)({})).not.toHaveProperty("announced");
  });
});
