import { Kysely, PostgresDialect } from "kysely";
import pg from "pg";
import { afterAll, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { OutboxPayloadError } from "../../src/contract/errors.js";
import { FollowUps } from "../../src/dispatch/follow-ups.js";
import { migrate } from "../../src/migrate/migrator.js";
import { disableNotifyTrigger, enableNotifyTrigger } from "../../src/migrate/notify-trigger.js";
import type { DedupedPublish } from "../../src/produce/publisher.js";
import { listen, testDatabase } from "../support/database.js";
import { shippedMigrationsUpTo } from "../support/migrations.js";
import { publisherFor, until, workerFactory } from "../support/worker.js";

/**
 * Producer dedupe keys and cancel (issue 29, item 4): while a message with a (queue, dedupe key) is
 * pending, publishing the key again is a no-op that answers with the pending message's id; `cancel`
 * removes a pending message by its key unless a live lease holds it.
 */

const db = testDatabase("ddc");
const workers = workerFactory(db);
const outbox = publisherFor(db.schema);
const m = db.names.messages;
// Kysely owns (and on destroy ends) its own pool.
const kysely = new Kysely<Record<string, never>>({
  dialect: new PostgresDialect({ pool: new pg.Pool({ connectionString: db.url, max: 2 }) }),
});

beforeAll(() => db.migrate());
beforeEach(async () => {
  await db.pool.query(`TRUNCATE ${m}, ${db.names.deadLetters}`);
});
afterAll(() => kysely.destroy());

interface Row {
  id: string;
  queue: string;
  key: string | null;
  dedupe_key: string | null;
  head: boolean;
  payload: unknown;
}
const rows = async (where = "true"): Promise<Row[]> =>
  (
    await db.pool.query(
      `SELECT id, queue, key, dedupe_key, head, payload FROM ${m} WHERE ${where} ORDER BY id`,
    )
  ).rows;

/** A promise the test resolves when it chooses. */
function gate() {
  let open!: () => void;
  const promise = new Promise<void>((resolve) => {
    open = resolve;
  });
  return { promise, open };
}

/** Whether the backend `pid` is waiting for a lock (a heavyweight one: a row's or a transaction's). */
async function waitingForLock(pid: number): Promise<boolean> {
  const { rows: r } = await db.pool.query("SELECT wait_event_type FROM pg_stat_activity WHERE pid = $1", [
    pid,
  ]);
  return r[0]?.wait_event_type === "Lock";
}

async function refusal(op: () => Promise<unknown>): Promise<OutboxPayloadError> {
  try {
    await op();
  } catch (error) {
    if (error instanceof OutboxPayloadError) return error;
    throw error;
  }
  throw new Error("expected a refusal, and it ran");
}

describe("publish with a dedupe key", () => {
  it("8 concurrent producers, released together: one message, the other 7 get its id; delivered, the key is free", {
    timeout: 120_000,
  }, async () => {
    const clients = await Promise.all(Array.from({ length: 8 }, () => db.pool.connect()));
    const go = gate();
    let results: DedupedPublish[];
    try {
      await Promise.all(clients.map((c) => c.query("BEGIN")));
      // Each in its own transaction; all insert at once, and each commits as soon as its publish answers:
      // the first insert's transaction is uncommitted while the other 7 collide with it.
      const running = Promise.all(
        clients.map(async (c, i) => {
          await go.promise;
          const result = await outbox.publish(c, "reminders", { n: i }, { dedupeKey: "order-1" });
          await c.query("COMMIT");
          return result;
        }),
      );
      go.open();
      results = await running;
    } finally {
      for (const c of clients) c.release();
    }
    const pending = await rows();
    expect(pending).toHaveLength(1);
    const [only] = pending;
    expect(only?.dedupe_key).toBe("order-1");
    expect(results.filter((r) => !r.deduplicated)).toEqual([{ id: only?.id, deduplicated: false }]);
    expect(results.filter((r) => r.deduplicated)).toEqual(
      Array.from({ length: 7 }, () => ({ id: only?.id, deduplicated: true })),
    );

    // Delivered: the key is free again.
    const handled: string[] = [];
    const worker = await workers.start({ queues: { reminders: (_p, msg) => void handled.push(msg.id) } });
    await until(async () => (await rows()).length === 0, "the message delivered");
    await worker.stop({ timeoutMs: 5000 });
    expect(handled).toEqual([only?.id]);
    const again = await db.inTransaction((c) =>
      outbox.publish(c, "reminders", { n: 9 }, { dedupeKey: "order-1" }),
    );
    expect(again.deduplicated).toBe(false);
    expect(again.id).not.toBe(only?.id);
    expect((await rows()).map((r) => r.id)).toEqual([again.id]);
  });

  it("a producer that rolls back frees the key for the one waiting on it", { timeout: 60_000 }, async () => {
    const a = await db.pool.connect();
    const b = await db.pool.connect();
    try {
      await a.query("BEGIN");
      await b.query("BEGIN");
      const first = await outbox.publish(a, "reminders", { from: "a" }, { dedupeKey: "k" });
      expect(first.deduplicated).toBe(false);
      const bPid = (await b.query<{ pid: number }>("SELECT pg_backend_pid() AS pid")).rows[0]?.pid as number;
      const second = outbox.publish(b, "reminders", { from: "b" }, { dedupeKey: "k" });
      // b waits for a's transaction: its row with the key is neither committed nor rolled back yet.
      await until(() => waitingForLock(bPid), "b waiting for a's transaction");
      await a.query("ROLLBACK");
      const answer = await second;
      expect(answer.deduplicated).toBe(false);
      expect(answer.id).not.toBe(first.id);
      await b.query("COMMIT");
      expect((await rows()).map((r) => [r.id, r.payload])).toEqual([[answer.id, { from: "b" }]]);
    } finally {
      a.release();
      b.release();
    }
  });

  it("dedupes per queue; keyless publishes are untouched; answers with the pending id through Kysely too", async () => {
    const first = await db.inTransaction((c) => outbox.publish(c, "q1", { n: 1 }, { dedupeKey: "x" }));
    const otherQueue = await db.inTransaction((c) => outbox.publish(c, "q2", { n: 2 }, { dedupeKey: "x" }));
    const plain = await db.inTransaction((c) => outbox.publish(c, "q1", { n: 3 }));
    expect(typeof plain).toBe("string");
    expect(otherQueue.deduplicated).toBe(false);
    const viaKysely = await kysely
      .transaction()
      .execute((trx) => outbox.publish(trx, "q1", { n: 4 }, { dedupeKey: "x", delayMs: 60_000 }));
    expect(viaKysely).toEqual({ id: first.id, deduplicated: true });
    // The pending message is untouched by the duplicate: its payload, its schedule.
    expect((await rows("queue = 'q1'")).map((r) => [r.id, r.dedupe_key, r.payload])).toEqual([
      [first.id, "x", { n: 1 }],
      [plain, null, { n: 3 }],
    ]);
  });

  it("publishes without a key never enter the dedupe index (it stays one empty page)", async () => {
    await db.inTransaction((c) =>
      outbox.publishMany(
        c,
        "plain",
        Array.from({ length: 2000 }, (_, n) => ({ payload: { n }, key: n % 2 ? `k${n % 10}` : undefined })),
      ),
    );
    const size = async (index: string) =>
      (
        await db.pool.query<{ bytes: string }>("SELECT pg_relation_size(to_regclass($1))::text AS bytes", [
          `${db.names.quotedSchema}.${index}`,
        ])
      ).rows[0]?.bytes;
    // A btree's metapage alone; the primary key beside it holds the 2,000 rows.
    expect(await size("messages_dedupe_key_idx")).toBe("8192");
    expect(Number(await size("messages_pkey"))).toBeGreaterThan(8192);
  });

  it("publishMany: each item's key, a repeat within the batch is a duplicate of its first", async () => {
    const pending = await db.inTransaction((c) => outbox.publish(c, "batch", { n: 0 }, { dedupeKey: "a" }));
    const answers = await db.inTransaction((c) =>
      outbox.publishMany(c, "batch", [
        { payload: { n: 1 }, dedupeKey: "a" },
        { payload: { n: 2 }, dedupeKey: "b" },
        { payload: { n: 3 }, dedupeKey: "b" },
        { payload: { n: 4 }, dedupeKey: "c", key: "ordered" },
      ]),
    );
    const stored = await rows();
    const idOf = (k: string) => stored.find((r) => r.dedupe_key === k)?.id;
    expect(answers).toEqual([
      { id: pending.id, deduplicated: true },
      { id: idOf("b"), deduplicated: false },
      { id: idOf("b"), deduplicated: true },
      { id: idOf("c"), deduplicated: false },
    ]);
    expect(stored.map((r) => [r.dedupe_key, r.payload])).toEqual([
      ["a", { n: 0 }],
      ["b", { n: 2 }],
      ["c", { n: 4 }],
    ]);
  });

  it("a skipped insert leaves no trace: the key's head stays right, the notify trigger is harmless", async () => {
    await enableNotifyTrigger(db.pool, db.schema);
    const listener = await listen(db.url, db.names.channel);
    try {
      const head = await db.inTransaction((c) =>
        outbox.publish(c, "ordered", { n: 1 }, { key: "K", dedupeKey: "d" }),
      );
      await listener.waitFor(1, 30_000);
      // The key-head trigger ran for the duplicate (BEFORE INSERT) and marked it "not head": discarded.
      const dup = await db.inTransaction((c) =>
        outbox.publish(c, "ordered", { n: 2 }, { key: "K", dedupeKey: "d" }),
      );
      expect(dup).toEqual({ id: head.id, deduplicated: true });
      const next = await db.inTransaction((c) => outbox.publish(c, "ordered", { n: 3 }, { key: "K" }));
      expect((await rows()).map((r) => [r.id, r.head])).toEqual([
        [head.id, true],
        [next, false],
      ]);
    } finally {
      await listener.close();
      await disableNotifyTrigger(db.pool, db.schema);
    }
  });
});

describe("cancel", () => {
  const publishWith = (dedupeKey: string, opts: { key?: string; delayMs?: number } = {}) =>
    db.inTransaction((c) => outbox.publish(c, "jobs", { dedupeKey }, { dedupeKey, ...opts }));
  const cancel = (dedupeKey: string) => db.inTransaction((c) => outbox.cancel(c, "jobs", dedupeKey));

  it("removes a pending message; says not_found for a key nobody holds", async () => {
    const { id } = await publishWith("p");
    expect(await cancel("p")).toEqual({ status: "cancelled", id });
    expect(await rows()).toEqual([]);
    expect(await cancel("p")).toEqual({ status: "not_found" });
    expect(await cancel("never")).toEqual({ status: "not_found" });
  });

  it("removes a scheduled message (future available_at), e.g. a reminder", async () => {
    const { id } = await publishWith("reminder", { delayMs: 3_600_000 });
    expect(await cancel("reminder")).toEqual({ status: "cancelled", id });
    expect(await rows()).toEqual([]);
  });

  it("keeps a message a live lease holds (delivering); removes one whose lease ran out", async () => {
    const live = await publishWith("live");
    const expired = await publishWith("expired");
    await db.pool.query(
      `UPDATE ${m} SET acquired_token = gen_random_uuid(), acquired_at = now(), acquired_by = 'w',
         lease_expires_at = now() + CASE WHEN id = $1 THEN interval '1 hour' ELSE interval '-1 second' END
       WHERE id IN ($1, $2)`,
      [live.id, expired.id],
    );
    expect(await cancel("live")).toEqual({ status: "delivering", id: live.id });
    expect(await cancel("expired")).toEqual({ status: "cancelled", id: expired.id });
    expect((await rows()).map((r) => r.id)).toEqual([live.id]);
  });

  it("rolls back with the caller's transaction", async () => {
    const { id } = await publishWith("r");
    const result = await db.inTransaction((c) => outbox.cancel(c, "jobs", "r"), true);
    expect(result).toEqual({ status: "cancelled", id });
    expect((await rows()).map((r) => r.id)).toEqual([id]);
  });

  it("a cancelled head of an ordered key hands its turn to the next, delivered in order", {
    timeout: 60_000,
  }, async () => {
    const first = await publishWith("first", { key: "K" });
    const second = await db.inTransaction((c) => outbox.publish(c, "jobs", { n: 2 }, { key: "K" }));
    const third = await db.inTransaction((c) => outbox.publish(c, "jobs", { n: 3 }, { key: "K" }));
    expect(await cancel("first")).toEqual({ status: "cancelled", id: first.id });
    // The successor is head at once, as after an ack (not a minute later by the key-head repair).
    expect((await rows()).map((r) => [r.id, r.head])).toEqual([
      [second, true],
      [third, false],
    ]);
    const handled: string[] = [];
    await workers.start({ queues: { jobs: (_p, msg) => void handled.push(msg.id) } });
    await until(async () => (await rows()).length === 0, "the key's other messages delivered", 30_000);
    expect(handled).toEqual([second, third]);
  });

  it("waits for a producer of the key in flight, so its message becomes head once the cancelled one goes", {
    timeout: 60_000,
  }, async () => {
    const head = await publishWith("head", { key: "K" });
    const producer = await db.pool.connect();
    const canceller = await db.pool.connect();
    try {
      await producer.query("BEGIN");
      // Behind the head (the trigger marks it so), not committed yet: it holds the key's lock.
      const next = await outbox.publish(producer, "jobs", { n: 2 }, { key: "K" });
      await canceller.query("BEGIN");
      const pid = (await canceller.query<{ pid: number }>("SELECT pg_backend_pid() AS pid")).rows[0]
        ?.pid as number;
      let settled = false;
      const cancelled = outbox.cancel(canceller, "jobs", "head").finally(() => {
        settled = true;
      });
      // The cancel waits for the key's lock (as an ack's promotion needs it): a promotion now could not see
      // the producer's row, and the key would be left without a head.
      await until(async () => settled || (await waitingForLock(pid)), "the cancel waiting or done");
      await producer.query("COMMIT");
      expect(await cancelled).toEqual({ status: "cancelled", id: head.id });
      await canceller.query("COMMIT");
      expect((await rows()).map((r) => [r.id, r.head])).toEqual([[next, true]]);
    } finally {
      producer.release();
      canceller.release();
    }
  });

  it("cancelling a message waiting behind its key's head leaves the order of the rest", async () => {
    const head = await db.inTransaction((c) => outbox.publish(c, "jobs", { n: 1 }, { key: "K" }));
    const middle = await publishWith("middle", { key: "K" });
    const last = await db.inTransaction((c) => outbox.publish(c, "jobs", { n: 3 }, { key: "K" }));
    expect(await cancel("middle")).toEqual({ status: "cancelled", id: middle.id });
    expect((await rows()).map((r) => [r.id, r.head])).toEqual([
      [head, true],
      [last, false],
    ]);
  });
});

describe("refusals, before anything is sent", () => {
  it("names dedupeKey: empty, too long, NUL; the caller's transaction stays usable", async () => {
    await db.inTransaction(async (c) => {
      const empty = await refusal(() => outbox.publish(c, "jobs", {}, { dedupeKey: "" }));
      expect(empty.field).toBe("dedupeKey");
      expect(empty.message).toMatch(/dedupeKey: must not be empty/);
      const long = await refusal(() => outbox.publish(c, "jobs", {}, { dedupeKey: "é".repeat(513) }));
      expect(long.message).toMatch(/dedupeKey: must be at most 1024 UTF-8 bytes/);
      const nul = await refusal(() => outbox.cancel(c, "jobs", "a\0b"));
      expect(nul.field).toBe("dedupeKey");
      expect(nul.message).toMatch(/NUL/);
      // 1024 bytes exactly is fine.
      const ok = await outbox.publish(c, "jobs", {}, { dedupeKey: "é".repeat(512) });
      expect(ok.deduplicated).toBe(false);
    });
  });

  it("refuses a batch mixing items with and without a dedupe key", async () => {
    const mixed = [{ payload: 1, dedupeKey: "a" }, { payload: 2 }] as unknown as {
      payload: number;
      dedupeKey: string;
    }[];
    const error = await refusal(() => db.inTransaction((c) => outbox.publishMany(c, "jobs", mixed)));
    expect(error.field).toBe("dedupeKey");
    expect(error.index).toBe(1);
    expect(error.message).toMatch(/give every item of a batch a dedupeKey, or none/);
  });

  it("refuses a dedupe key on a topic event and on a handler's follow-up", async () => {
    const topic = await refusal(() =>
      db.inTransaction((c) =>
        outbox.publishToTopic(c, "order.placed", {}, { dedupeKey: "a" } as unknown as undefined),
      ),
    );
    expect(topic.field).toBe("dedupeKey");
    expect(topic.message).toMatch(/not supported when publishing to a topic/);
    const many = await refusal(() =>
      db.inTransaction((c) =>
        outbox.publishManyToTopic(c, "order.placed", [
          { payload: 1 },
          { payload: 2, dedupeKey: "b" },
        ] as never),
      ),
    );
    expect(many.index).toBe(1);
    const followUps = new FollowUps();
    const followUp = await refusal(async () =>
      followUps.add("jobs", {}, { dedupeKey: "a" } as unknown as undefined),
    );
    expect(followUp.field).toBe("dedupeKey");
    expect(followUp.message).toMatch(/not supported on a follow-up/);
    expect(followUps.prepared).toEqual([]);
  });
});

describe("migrations 0017 and 0020 on an outbox in use", () => {
  it("builds the unique index although plain SQL gave two pending rows one key before it existed", {
    timeout: 120_000,
  }, async () => {
    const schema = db.freshSchema("mig");
    const s = `"${schema}"`;
    await migrate({ connection: db.pool, schema, migrationsDir: await shippedMigrationsUpTo(17) });
    // Between 0017 and 0020 nothing stops a plain-SQL producer from repeating a key.
    await db.pool.query(
      `INSERT INTO ${s}.messages (queue, payload, dedupe_key) VALUES ('q', '1', 'k'), ('q', '2', 'k'), ('q', '3', 'other')`,
    );
    const refused = await db.pool
      .query(`INSERT INTO ${s}.messages (queue, payload, dedupe_key) VALUES ('q', '4', '')`)
      .then(
        () => "inserted",
        (error: Error) => error.message,
      );
    expect(refused).toMatch(/messages_dedupe_key_bounded/);
    await migrate({ connection: db.pool, schema });
    const { rows: kept } = await db.pool.query(`SELECT payload, dedupe_key FROM ${s}.messages ORDER BY id`);
    // Every message stays; the later repeat loses its key, the oldest keeps it.
    expect(kept).toEqual([
      { payload: 1, dedupe_key: "k" },
      { payload: 2, dedupe_key: null },
      { payload: 3, dedupe_key: "other" },
    ]);
    const { rows: idx } = await db.pool.query(
      `SELECT i.indisunique AS unique, i.indisvalid AS valid FROM pg_index AS i
       WHERE i.indexrelid = to_regclass($1)`,
      [`${s}.messages_dedupe_key_idx`],
    );
    expect(idx).toEqual([{ unique: true, valid: true }]);
    const { rows: check } = await db.pool.query(
      `SELECT convalidated FROM pg_constraint WHERE conname = 'messages_dedupe_key_bounded'
       AND conrelid = to_regclass($1)`,
      [`${s}.messages`],
    );
    expect(check).toEqual([{ convalidated: true }]);
  });
});
