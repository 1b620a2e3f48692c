import { beforeAll, beforeEach, describe, expect, it } from "vitest";
import { z } from "zod";
import { constant, defineQueue, followUp, OutboxError, type Worker } from "../../src/index.js";
import { testDatabase } from "../support/database.js";
import { type LogLine, memoryLogger } from "../support/memory-logger.js";
import { nextEvent, publisherFor, until, workerFactory } from "../support/worker.js";

/**
 * Follow-up messages are inserted by their parent's ack, in its transaction and under its lease token:
 * each test here counts follow-ups after a fault and finds exactly one set (or none where the parent was
 * not acknowledged). The crash case, with a child process, is in follow-ups-crash.test.ts.
 */

const db = testDatabase("fup");
const workers = workerFactory(db);
const outbox = publisherFor(db.schema);

beforeAll(() => db.migrate());
beforeEach(async () => {
  await db.pool.query(`TRUNCATE ${db.names.messages}, ${db.names.deadLetters}`);
});

async function publish(queue: string, payloads: unknown[], key?: string): Promise<string[]> {
  return db.inTransaction((c) =>
    outbox.publishMany(
      c,
      queue,
      payloads.map((payload) => ({ payload, ...(key ? { key } : {}) })),
    ),
  );
}

interface Row {
  id: string;
  queue: string;
  payload: unknown;
  headers: Record<string, string>;
  key: string | null;
  delay_ms: number;
  head: boolean;
}

async function rows(queue: string): Promise<Row[]> {
  const { rows } = await db.pool.query<Row>(
    `SELECT id::text, queue, payload, headers, key, head,
            round(extract(epoch FROM available_at - created_at) * 1000)::int AS delay_ms
     FROM ${db.names.messages} WHERE queue = $1 ORDER BY id`,
    [queue],
  );
  return rows;
}

async function count(queue?: string): Promise<number> {
  const { rows } = await db.pool.query(
    `SELECT count(*)::int AS n FROM ${db.names.messages} WHERE $1::text IS NULL OR queue = $1`,
    [queue ?? null],
  );
  return rows[0].n as number;
}

function gate() {
  let open!: () => void;
  const opened = new Promise<void>((resolve) => {
    open = resolve;
  });
  return { open, opened };
}

/** Only the test's back-dating or theft ends a lease; one fetch at start, the next a minute later. */
const longLease = {
  leaseTtlMs: 60_000,
  heartbeatMs: 30_000,
  listen: false,
  minPollIntervalMs: 60_000,
  maxPollIntervalMs: 60_000,
} as const;

describe("follow-ups land once, as published", () => {
  it("returned and context-published follow-ups carry their queue, payload, key, headers and delay", async () => {
    const [parent] = await publish("parent", [{ n: 1 }]);
    const big = "12345678901234567890";
    const worker = await workers.start({
      queues: {
        parent: async (payload: unknown, message) => {
          message.publish("via-context", { from: (payload as { n: number }).n }, { headers: { "x-a": "1" } });
          message.publish("delayed", { later: true }, { delayMs: 60_000 });
          return [
            followUp("returned", { big: Number(big) }, { key: "k-1", headers: { "x-b": "2" } }),
            followUp("returned", { second: true }, { key: "k-1" }),
          ];
        },
      },
    });
    await until(async () => (await count("parent")) === 0, "the parent is acknowledged");
    const [ctx] = await rows("via-context");
    expect(ctx).toMatchObject({ payload: { from: 1 }, key: null, headers: { "x-a": "1" } });
    // No delay, against the other's minute: the gap is only the insert's own time, long on a busy machine.
    expect(ctx?.delay_ms).toBeLessThan(30_000);
    const [delayed] = await rows("delayed");
    expect(delayed?.payload).toEqual({ later: true });
    expect(delayed?.delay_ms).toBeGreaterThanOrEqual(59_000);
    const returned = await rows("returned");
    expect(returned.map((r) => [r.payload, r.key, r.headers, r.head])).toEqual([
      [{ big: Number(big) }, "k-1", { "x-b": "2" }, true],
      // Same key, later id: waits behind the first.
      [{ second: true }, "k-1", {}, false],
    ]);
    // Every follow-up is a new row, after its parent.
    for (const r of [ctx, delayed, ...returned])
      expect(BigInt(r?.id ?? 0)).toBeGreaterThan(BigInt(parent ?? 0));
    await worker.stop();
  });

  it("a handler returning a value that is not a follow-up acks as before, publishing nothing", async () => {
    await publish("plain", [{}]);
    await workers.start({ queues: { plain: () => [1, { queue: "no payload" }] as never } });
    await until(async () => (await count()) === 0, "acknowledged, nothing inserted");
  });

  it("follow-ups wake a listening worker like a publish does", async () => {
    const handled: string[] = [];
    // Polls only once a minute: only a notification can bring the follow-up to this worker quickly.
    const listener = await workers.start({
      minPollIntervalMs: 60_000,
      maxPollIntervalMs: 60_000,
      queues: { woken: (_p, m) => void handled.push(m.id) },
    });
    await workers.start({ queues: { waker: () => followUp("woken", {}) } });
    await publish("waker", [{}]);
    await until(() => handled.length === 1, "the follow-up reached the listening worker");
    expect(listener.id).toBeTruthy();
  });
});

describe("a lost lease publishes nothing", () => {
  it("the first handler outlives its lease; the second owner's ack inserts the one set, the late ack none", async () => {
    const [id] = await publish("chain", [{ step: 1 }]);
    const finishA = gate();
    let aRunning = false;
    const a = await workers.start({
      ...longLease,
      queues: {
        chain: async () => {
          aRunning = true;
          await finishA.opened;
          return followUp("next", { by: "a" });
        },
      },
    });
    await until(() => aRunning, "A runs the parent");
    const aLost = nextEvent<{ id: string }>(a, "lease_lost");
    await db.pool.query(`UPDATE ${db.names.messages} SET lease_expires_at = now() - interval '1 second'`);
    const b = await workers.start({
      queues: { chain: (_p, m) => m.publish("next", { by: "b" }) },
    });
    const bAcked = nextEvent<{ id: string }>(b, "acked");
    expect((await bAcked).id).toBe(id);
    expect((await rows("next")).map((r) => r.payload)).toEqual([{ by: "b" }]);

    finishA.open();
    expect((await aLost).id).toBe(id);
    expect((await rows("next")).map((r) => r.payload)).toEqual([{ by: "b" }]);
  });

  for (const keyed of [false, true]) {
    it(`a batch of acks from several handlers, one lease stolen: only valid parents' follow-ups (${
      keyed ? "keyed" : "keyless"
    } parents)`, async () => {
      const payloads = [0, 1, 2, 3].map((i) => ({ i }));
      // Keyed parents each under their own key, so all four are heads and run at once.
      const ids = keyed
        ? (await Promise.all(payloads.map((p) => publish("batch", [p], `key-${p.i}`)))).flat()
        : await publish("batch", payloads);
      const finish = gate();
      let running = 0;
      const worker: Worker = await workers.start({
        ...longLease,
        concurrency: 4,
        // A wide window: the four acks go out as one batch, in one statement (keyless) or transaction.
        completionWindowMs: 200,
        queues: {
          batch: async (payload: unknown, message) => {
            running++;
            await finish.opened;
            const { i } = payload as { i: number };
            message.publish("next", { parent: i, form: "context" });
            return followUp("next", { parent: i, form: "returned" }, { key: `next-${i % 2}` });
          },
        },
      });
      await until(() => running === 4, "four handlers run at once");
      const stolen = ids[2];
      await db.pool.query(
        `UPDATE ${db.names.messages} SET acquired_token = gen_random_uuid(), acquired_by = 'thief' WHERE id = $1`,
        [stolen],
      );
      const lost = nextEvent<{ id: string }>(worker, "lease_lost");
      finish.open();
      expect((await lost).id).toBe(stolen);
      await until(async () => (await count("batch")) === 1, "the three valid parents are acknowledged");
      const next = await rows("next");
      const parents = next.map((r) => (r.payload as { parent: number }).parent);
      expect(parents.sort()).toEqual([0, 0, 1, 1, 3, 3]);
      // The stolen row is untouched: still the thief's.
      const { rows: left } = await db.pool.query(
        `SELECT id::text, acquired_by FROM ${db.names.messages} WHERE queue = 'batch'`,
      );
      expect(left).toEqual([{ id: stolen, acquired_by: "thief" }]);
    });
  }
});

describe("keyed follow-ups keep per-key order", () => {
  it("chains that publish into their own key run one at a time, in id order, and never stall the key", async () => {
    await publish(
      "chain",
      [
        { c: "a", n: 0 },
        { c: "b", n: 0 },
      ],
      "k",
    );
    const order: string[] = [];
    let running = 0;
    let overlap = 0;
    await workers.start({
      concurrency: 8,
      queues: {
        chain: async (payload: unknown, message) => {
          const { c, n } = payload as { c: string; n: number };
          running++;
          if (running > 1) overlap++;
          order.push(`${c}${n}`);
          await new Promise((resolve) => setImmediate(resolve));
          running--;
          if (n < 3) message.publish("chain", { c, n: n + 1 }, { key: message.key ?? undefined });
        },
      },
    });
    await until(() => order.length === 8, "both chains ran to the end");
    expect(overlap).toBe(0);
    // Each follow-up queues behind the other chain's row, already in line: the chains interleave.
    expect(order).toEqual(["a0", "b0", "a1", "b1", "a2", "b2", "a3", "b3"]);
    await until(async () => (await count()) === 0, "the key drained");
  });

  it("follow-ups of many keyless parents into one key are delivered one at a time, in id order", async () => {
    await publish(
      "fan",
      Array.from({ length: 20 }, (_, i) => ({ i })),
    );
    const seen: bigint[] = [];
    let running = 0;
    let overlap = 0;
    await workers.start({
      concurrency: 8,
      queues: {
        fan: (payload: unknown) => followUp("sink", payload, { key: "one" }),
        sink: async (_payload: unknown, message) => {
          running++;
          if (running > 1) overlap++;
          seen.push(BigInt(message.id));
          await new Promise((resolve) => setImmediate(resolve));
          running--;
        },
      },
    });
    await until(async () => (await count()) === 0, "every parent and follow-up acknowledged");
    expect(seen).toHaveLength(20);
    expect(overlap).toBe(0);
    expect(seen).toEqual([...seen].sort((x, y) => (x < y ? -1 : 1)));
  });
});

describe("a producer holding a follow-up's key", () => {
  /**
   * The worker tried to ack: it either found a follow-up key busy and let go ("kept in place", debug) or
   * waits for that key's lock (what a worker that could deadlock does). Either way the race is on.
   */
  async function ackTried(lines: LogLine[]): Promise<boolean> {
    if (lines.some((l) => /kept in place/.test(l.msg))) return true;
    const { rows } = await db.pool.query(
      `SELECT count(*)::int AS n FROM pg_stat_activity
       WHERE wait_event_type = 'Lock' AND wait_event = 'advisory' AND query LIKE '%' || $1 || '%'`,
      [db.schema],
    );
    return rows[0].n > 0;
  }

  it("never deadlocks with the ack: the worker lets go of its locks while the key is busy, and the follow-up lands after the producer's row", async () => {
    await publish("dl.parent", [{ n: 1 }], "A");
    const { logger, lines } = memoryLogger();
    logger.level = "debug";
    const errors: unknown[] = [];
    const producer = await db.pool.connect();
    try {
      await producer.query("BEGIN");
      await outbox.publish(producer, "dl.child", { from: "producer" }, { key: "B" });
      let handled = 0;
      const worker = await workers.start({
        logger,
        queues: {
          "dl.parent": () => {
            handled++;
            return followUp("dl.child", { from: "handler" }, { key: "B" });
          },
        },
      });
      worker.on("loop_error", (e) => errors.push(e.error));
      // The ack was tried: it either waits for B's lock (holding A's, taken by the keyed ack) or found B
      // busy and let go of everything.
      await until(async () => handled === 1 && (await ackTried(lines)), "the worker tried to ack the parent");
      // The producer now takes the parent's key too: a worker holding A while waiting for B would deadlock.
      await outbox.publish(producer, "dl.parent", { n: 2 }, { key: "A" });
      await producer.query("COMMIT");
    } finally {
      producer.release();
    }
    await until(async () => (await count("dl.parent")) === 0, "both parents acknowledged");
    // Commit order per key: the producer's B first, then each parent's follow-up.
    expect((await rows("dl.child")).map((r) => r.payload)).toEqual([
      { from: "producer" },
      { from: "handler" },
      { from: "handler" },
    ]);
    expect(errors).toEqual([]);
  });
  it("a keyless parent's keyed follow-ups are taken the same way: no deadlock with a producer taking their keys in the other order", async () => {
    await publish("dl2.parent", [{ n: 1 }]);
    const { logger, lines } = memoryLogger();
    logger.level = "debug";
    const errors: unknown[] = [];
    const producer = await db.pool.connect();
    try {
      await producer.query("BEGIN");
      await outbox.publish(producer, "dl2.child", { from: "producer", key: "C" }, { key: "C" });
      let handled = 0;
      const worker = await workers.start({
        logger,
        queues: {
          "dl2.parent": () => {
            handled++;
            // Locks are taken in key order: B, then C (held by the producer).
            return [
              followUp("dl2.child", { from: "handler", key: "B" }, { key: "B" }),
              followUp("dl2.child", { from: "handler", key: "C" }, { key: "C" }),
            ];
          },
        },
      });
      worker.on("loop_error", (e) => errors.push(e.error));
      await until(async () => handled === 1 && (await ackTried(lines)), "the worker tried to ack the parent");
      // The producer takes B after C: a worker holding B while waiting for C would deadlock.
      await outbox.publish(producer, "dl2.child", { from: "producer", key: "B" }, { key: "B" });
      await producer.query("COMMIT");
    } finally {
      producer.release();
    }
    await until(async () => (await count("dl2.parent")) === 0, "the parent acknowledged");
    expect((await rows("dl2.child")).map((r) => r.payload)).toEqual([
      { from: "producer", key: "C" },
      { from: "producer", key: "B" },
      { from: "handler", key: "B" },
      { from: "handler", key: "C" },
    ]);
    expect(errors).toEqual([]);
  });
});

describe("a producer holding a follow-up's key past the query timeout", () => {
  it("the parent's ack waits, its lease renewed, and lands after the commit: no failure, no second delivery", async () => {
    await publish("dl3.parent", [{ n: 1 }]);
    const problems: string[] = [];
    let handled = 0;
    const producer = await db.pool.connect();
    try {
      await producer.query("BEGIN");
      await outbox.publish(producer, "dl3.child", { from: "producer" }, { key: "D" });
      // A query timeout no plain statement reaches on a busy machine: the held key outlasts it many times.
      const worker = await workers.start({
        leaseTtlMs: 4000,
        queryTimeoutMs: 1000,
        maxConsecutiveFailures: 3,
        loopBackoffBaseMs: 10,
        loopBackoffMaxMs: 50,
        queues: {
          "dl3.parent": () => {
            handled++;
            return followUp("dl3.child", { from: "handler" }, { key: "D" });
          },
        },
      });
      for (const event of ["loop_error", "fatal", "lease_lost"] as const) {
        worker.on(event, () => problems.push(event));
      }
      // Handled, its ack busy on D: still held after 4 s of renewals, four query timeouts later.
      await until(
        async () => {
          const { rows } = await db.pool.query(
            `SELECT bool_and(lease_expires_at - acquired_at > interval '8 seconds') AS long
             FROM ${db.names.messages} WHERE queue = 'dl3.parent'`,
          );
          return rows[0]?.long === true;
        },
        "the parent's lease renewed for 4 s",
        60_000,
      );
      expect(problems).toEqual([]);
      await producer.query("COMMIT");
    } finally {
      await producer.query("ROLLBACK").catch(() => {});
      producer.release();
    }
    await until(async () => (await count("dl3.parent")) === 0, "the parent acknowledged");
    expect((await rows("dl3.child")).map((r) => r.payload)).toEqual([
      { from: "producer" },
      { from: "handler" },
    ]);
    expect(handled).toBe(1);
    expect(problems).toEqual([]);
  });
});

describe("an invalid follow-up fails the handler", () => {
  const typed = defineQueue("typed", z.object({ n: z.number() }));

  it("a follow-up Postgres would refuse (a NUL) fails its own handler, not the batch it would have joined", async () => {
    await publish("mixed", [{ bad: true }, { bad: false }]);
    const worker = await workers.start({
      concurrency: 2,
      completionWindowMs: 100,
      retry: constant(60_000),
      queues: {
        mixed: (payload: unknown) => {
          const { bad } = payload as { bad: boolean };
          return followUp("out", { text: bad ? "a\u0000b" : "fine" });
        },
      },
    });
    const retried = nextEvent<{ error: string }>(worker, "retried");
    expect((await retried).error).toMatch(/NUL/);
    await until(async () => (await count("out")) === 1, "the valid parent's follow-up landed");
    expect((await rows("out")).map((r) => r.payload)).toEqual([{ text: "fine" }]);
    expect(await count("mixed")).toBe(1);
  });

  it("message.publish after the handler returned throws: the outcome was already decided", async () => {
    await publish("late", [{}]);
    let late: (() => void) | undefined;
    await workers.start({
      queues: {
        late: (_p, message) => {
          late = () => message.publish("never", {});
        },
      },
    });
    await until(async () => (await count("late")) === 0, "acknowledged");
    expect(() => late?.()).toThrow(/after the handler returned/);
    expect(() => late?.()).toThrow(OutboxError);
    expect(await count("never")).toBe(0);
  });

  it("the delivery is retried and nothing is inserted; a valid run then publishes once", async () => {
    await publish("source", [{}]);
    let attempt = 0;
    const worker = await workers.start({
      retry: constant(10),
      queues: {
        source: (_p, message) => {
          attempt++;
          if (attempt === 1) message.publish(typed, { n: 1 }); // valid, but dropped with the failed run
          if (attempt === 1) return followUp(typed, { n: "not a number" } as never);
          if (attempt === 2) message.publish("x", {}, { delayMs: 1, availableAt: new Date() });
          return followUp(typed, { n: 3 });
        },
      },
    });
    const retried = nextEvent<{ error: string }>(worker, "retried");
    expect((await retried).error).toMatch(/invalid payload.*n/);
    await until(async () => (await count("source")) === 0, "the third run acks");
    expect(attempt).toBe(3);
    expect((await rows("typed")).map((r) => r.payload)).toEqual([{ n: 3 }]);
    expect(await count("x")).toBe(0);
  });
});
