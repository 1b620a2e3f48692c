import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { z } from "zod";
import { followUp } from "../../src/contract/follow-up.js";
import type { Handler, MessageContext, QueueConfig } from "../../src/contract/handler.js";
import { PermanentError, TransientError } from "../../src/contract/handler-errors.js";
import { defineQueue } from "../../src/produce/queue.js";
import { defineTopic } from "../../src/produce/topic.js";
import { constant, exponential, linear } from "../../src/retry/strategies.js";
import { subscribe } from "../../src/subscribe/subscriptions.js";
import { createManualClock, type TestOutcome, testHandler, testTopic } from "../../src/testing/index.js";
import type { WorkerOptions } from "../../src/worker/options.js";
import { createWorker, type Worker } from "../../src/worker/worker.js";
import { testDatabase } from "../support/database.js";
import { memoryLogger } from "../support/memory-logger.js";
import { publisherFor } from "../support/worker.js";

/**
 * The harness's claim: it reaches the verdict the worker writes. Every case of the table runs twice, once
 * through testHandler and once through a real worker on Postgres from a row shaped the same way (attempts,
 * failures, deliveries, key, headers), and both results are compared in one shape.
 */

const db = testDatabase("hag");
const stopLater: Worker[] = [];
afterAll(async () => {
  await Promise.all(stopLater.map((w) => w.stop({ timeoutMs: 2000 }).catch(() => {})));
});
const outbox = publisherFor(db.schema);

/** Worker-level settings shared by both sides: the queues without their own fall back on these. */
const WORKER = { retry: constant(90_000), maxAttempts: 4 } satisfies Partial<WorkerOptions>;
/** Far enough that no retried row comes due again while the test looks at it. */
const LATER = 60_000;

interface Before {
  attempts?: number;
  failures?: number;
  /** deliveries_count before this lease (the lease adds one). */
  deliveries?: number;
  firstAttemptAt?: Date;
  lastAttemptAt?: Date;
  key?: string;
  headers?: Record<string, string>;
}

interface Case {
  name: string;
  settings?: Omit<QueueConfig, "handler">;
  handler: Handler;
  payload?: unknown;
  before?: Before;
  /** The default strategy's jitter: compare the delay's range, not its value. */
  delayBetween?: [number, number];
  /** The worker logs the strategy's problem; the harness reports it. */
  strategyProblem?: true;
}

const orders = defineQueue("orders", z.object({ orderId: z.string(), total: z.number().int().positive() }));
const fail = (error: unknown) => () => {
  throw error;
};
/** A handler that ignores its work until the timeout aborts its signal (then returns: too late). */
const hang: Handler = (_p, m) =>
  new Promise<void>((resolve) => m.signal.addEventListener("abort", () => resolve()));
const old = new Date(Date.UTC(2019, 5, 1));

const CASES: Case[] = [
  { name: "sync ack", handler: () => {} },
  { name: "async ack", handler: async () => {} },
  {
    name: "ack with follow-ups",
    handler: async (p, m) => {
      m.publish(`fu-${m.queue}`, { from: p }, { key: "fk", headers: { h: "1" } });
      return [followUp(`fu-${m.queue}`, { second: true }), followUp(`fu-${m.queue}`, [1, "two"])];
    },
  },
  {
    name: "invalid follow-up fails the attempt",
    handler: () => followUp(defineQueue("fu-typed", z.object({ a: z.string() })), { a: 1 } as never),
  },
  { name: "error, worker-level strategy and maxAttempts", handler: fail(new Error("boom")) },
  {
    name: "error at the worker-level maxAttempts",
    handler: fail(new Error("boom")),
    before: { attempts: 3 },
  },
  {
    name: "queue maxAttempts over the worker's",
    settings: { maxAttempts: 6, retry: constant(LATER) },
    handler: fail(new Error("boom")),
    before: { attempts: 3 },
  },
  {
    name: "transient one short of maxAttempts",
    handler: fail(new TransientError("busy")),
    before: { attempts: 5, failures: 3 },
  },
  {
    name: "network error is transient",
    handler: fail(Object.assign(new Error("reset"), { code: "ECONNRESET" })),
    before: { attempts: 3, failures: 3 },
  },
  {
    name: "fetch failed with a network cause",
    handler: fail(
      new TypeError("fetch failed", { cause: Object.assign(new Error("x"), { code: "ENOTFOUND" }) }),
    ),
  },
  { name: "permanent error", handler: fail(new PermanentError("bad")), settings: { maxAttempts: 100 } },
  { name: "thrown string", handler: fail("just a string") },
  { name: "error with a cause chain", handler: fail(new Error("outer", { cause: new RangeError("inner") })) },
  { name: "error longer than maxErrorLength", handler: fail(new Error("e".repeat(5000))) },
  {
    name: 'strategy says "stop"',
    settings: { retry: () => "stop", maxAttempts: 100 },
    handler: fail(new Error("x")),
    before: { attempts: 1 },
  },
  {
    name: 'transient and "stop"',
    settings: { retry: () => "stop" },
    handler: fail(new TransientError("t")),
    before: { attempts: 2, failures: 1 },
  },
  {
    name: "strategy returns garbage",
    settings: { retry: () => Number.NaN, maxAttempts: 100 },
    handler: fail(new Error("x")),
    before: { attempts: 10, failures: 10 },
    // The default after attempt 11: 1 s × 2^10, equal jitter.
    delayBetween: [512_000, 1_024_000],
    strategyProblem: true,
  },
  {
    name: "strategy throws",
    settings: {
      retry: () => {
        throw new Error("no");
      },
      maxAttempts: 100,
    },
    handler: fail(new Error("x")),
    before: { attempts: 12, failures: 12 },
    // Capped at 1 hour before jitter.
    delayBetween: [1_800_000, 3_600_000],
    strategyProblem: true,
  },
  {
    name: "exponential without jitter",
    settings: { retry: exponential({ baseMs: LATER, jitter: "none", maxMs: 10 * LATER }) },
    handler: fail(new Error("x")),
    before: { attempts: 2, failures: 2 },
  },
  {
    name: "linear",
    settings: { retry: linear({ stepMs: LATER }), maxAttempts: 10 },
    handler: fail(new Error("x")),
    before: { attempts: 4, failures: 1 },
  },
  {
    name: "strategy reads the first attempt's time",
    settings: {
      retry: (ctx) => ((ctx.firstAttemptAt?.getTime() ?? 0) < Date.UTC(2020, 0, 1) ? "stop" : LATER),
    },
    handler: fail(new Error("x")),
    before: { attempts: 1, firstAttemptAt: old, lastAttemptAt: old },
  },
  {
    name: "schema accepts (and strips)",
    settings: { schema: orders.schema as z.ZodType },
    handler: (p) => {
      if (Object.keys(p as object).length !== 2)
        throw new PermanentError(`not stripped: ${JSON.stringify(p)}`);
    },
    payload: { orderId: "o1", total: 3, extra: true },
  },
  {
    name: "schema rejects",
    settings: { schema: orders.schema as z.ZodType },
    handler: () => {},
    payload: { orderId: 7, total: -1 },
    before: { attempts: 2 },
  },
  {
    name: "raw payload queue",
    settings: { rawPayload: true },
    handler: (p) => {
      if (typeof p !== "string" || JSON.parse(p).n !== 1) throw new PermanentError("not the stored text");
    },
  },
  {
    name: "raw payload handler fails",
    settings: { rawPayload: true, retry: constant(LATER) },
    handler: fail(new Error("relay down")),
  },
  { name: "max deliveries", handler: () => {}, before: { deliveries: 25 } },
  {
    name: "one delivery short of max deliveries",
    handler: () => {},
    before: { deliveries: 24, attempts: 3 },
  },
  {
    name: "context shaped",
    handler: (_p, m) => {
      throw new Error(`${m.attempts}/${m.deliveries}/${m.key}/${m.headers.tenant}`);
    },
    before: { attempts: 2, failures: 1, deliveries: 5, key: "customer-9", headers: { tenant: "acme" } },
  },
  { name: "timeout", settings: { timeoutMs: 200 }, handler: hang },
  {
    name: "timeout on the last attempt",
    settings: { timeoutMs: 200, maxAttempts: 2 },
    handler: hang,
    before: { attempts: 1 },
  },
  {
    name: "timeout, strategy stops",
    settings: { timeoutMs: 200, retry: () => "stop", maxAttempts: 9 },
    handler: hang,
  },
];

/** One shape for both sides: what the database ends up holding. */
type Written =
  | { kind: "acked"; followUps: { queue: string; payload: unknown; key: string | null; headers: unknown }[] }
  | {
      kind: "retried";
      delayMs: number;
      attempts: number;
      failures: number;
      error: string;
      transient?: boolean;
      timedOut?: boolean;
    }
  | { kind: "dead"; reason: string; error: string | null; attempts: number; failures: number }
  | { kind: "lost" };

interface Seen {
  queue: string;
  topic: string | null;
  attempts: number;
  deliveries: number;
  key: string | null;
  headers: Record<string, string>;
  rawPayloadParsed: unknown;
}

const seen = (m: MessageContext): Seen => ({
  queue: m.queue,
  topic: m.topic,
  attempts: m.attempts,
  deliveries: m.deliveries,
  key: m.key,
  headers: m.headers,
  rawPayloadParsed: JSON.parse(m.rawPayload),
});

function fromHarness(outcome: TestOutcome): Written {
  switch (outcome.kind) {
    case "acked":
      return {
        kind: "acked",
        followUps: outcome.followUps.map(({ queue, payload, key, headers }) => ({
          queue,
          payload,
          key,
          headers,
        })),
      };
    case "retried": {
      const { delayMs, attempts, failures, error, transient, timedOut } = outcome;
      return { kind: "retried", delayMs, attempts, failures, error, transient, timedOut };
    }
    case "dead": {
      const { reason, error, attempts, failures } = outcome;
      return { kind: "dead", reason, error, attempts, failures };
    }
    default:
      return { kind: "lost" };
  }
}

/** What the database holds for a row after its delivery: still there (retried), dead, or gone (acked). */
async function writtenFor(
  id: string,
  followUpQueue: string,
  events: Map<string, { transient: boolean; timedOut: boolean }>,
): Promise<Written> {
  const live = await db.pool.query(
    `SELECT attempts_count, failures_count, last_error,
            round(extract(epoch FROM available_at - last_attempt_at) * 1000)::float8 AS delay_ms
     FROM ${db.names.messages} WHERE id = $1`,
    [id],
  );
  const dead = await db.pool.query(
    `SELECT reason, error, attempts_count, failures_count FROM ${db.names.deadLetters} WHERE id = $1`,
    [id],
  );
  if (live.rows[0]) {
    const r = live.rows[0];
    return {
      kind: "retried",
      delayMs: r.delay_ms,
      attempts: r.attempts_count,
      failures: r.failures_count,
      error: r.last_error,
      ...events.get(id),
    };
  }
  if (dead.rows[0]) {
    const r = dead.rows[0];
    return {
      kind: "dead",
      reason: r.reason,
      error: r.error,
      attempts: r.attempts_count,
      failures: r.failures_count,
    };
  }
  const follow = await db.pool.query(
    `SELECT queue, payload, key, headers FROM ${db.names.messages} WHERE queue = $1 ORDER BY id`,
    [followUpQueue],
  );
  return { kind: "acked", followUps: follow.rows };
}

/** Done when each row is gone (acked or dead) or carries one more attempt (retried, due much later). */
async function settled(ids: string[]): Promise<void> {
  await vi.waitFor(
    async () => {
      const { rows } = await db.pool.query(
        `SELECT count(*)::int AS pending FROM ${db.names.messages}
         WHERE id = ANY($1::bigint[]) AND (acquired_token IS NOT NULL OR available_at <= now())`,
        [ids],
      );
      expect(rows[0].pending).toBe(0);
    },
    { timeout: 30_000, interval: 50 },
  );
}

const queueName = (i: number) => `agree-${i}`;
const payloadOf = (c: Case) => c.payload ?? { n: 1 };

describe("the harness agrees with the worker on the same cases", () => {
  const ids: string[] = [];
  const worker = new Map<number, { written: Written; seen: Seen | undefined }>();
  const harness = new Map<number, { written: Written; seen: Seen | undefined; problem: boolean }>();

  beforeAll(async () => {
    await db.migrate();
    // Published as plain JSON (by queue name, no schema), then shaped as if earlier attempts had happened.
    for (const [i, c] of CASES.entries()) {
      const b = c.before ?? {};
      const id = await db.inTransaction((client) =>
        outbox.publish(client, queueName(i), payloadOf(c), {
          ...(b.key ? { key: b.key } : {}),
          ...(b.headers ? { headers: b.headers } : {}),
        }),
      );
      const attempts = b.attempts ?? 0;
      await db.pool.query(
        `UPDATE ${db.names.messages}
         SET attempts_count = $2, failures_count = $3, deliveries_count = $4,
             first_attempt_at = $5, last_attempt_at = $6
         WHERE id = $1`,
        [
          id,
          attempts,
          b.failures ?? attempts,
          b.deliveries ?? attempts,
          b.firstAttemptAt ?? (attempts ? new Date() : null),
          b.lastAttemptAt ?? (attempts ? new Date() : null),
        ],
      );
      ids.push(String(id));
    }
  });

  it("runs every case through a real worker", { timeout: 180_000 }, async () => {
    const seenBy = new Map<string, Seen>();
    const events = new Map<string, { transient: boolean; timedOut: boolean }>();
    const { logger, lines } = memoryLogger();
    const queues = Object.fromEntries(
      CASES.map((c, i) => [
        queueName(i),
        {
          ...c.settings,
          handler: (p: unknown, m: MessageContext) => {
            seenBy.set(m.id, seen(m));
            return c.handler(p, m);
          },
        },
      ]),
    );
    // Not through workerFactory: the listener must be on before the first delivery.
    const w = createWorker({
      connection: db.url,
      schema: db.schema,
      minPollIntervalMs: 20,
      maxPollIntervalMs: 200,
      ...WORKER,
      queues,
      logger,
    });
    w.on("retried", (e) => events.set(e.id, { transient: e.transient, timedOut: e.timedOut }));
    stopLater.push(w);
    await w.start();
    await settled(ids);
    await w.stop();

    for (const [i, c] of CASES.entries()) {
      const id = ids[i] as string;
      const written = await writtenFor(id, `fu-${queueName(i)}`, events);
      worker.set(i, { written, seen: seenBy.get(id) });
      if (c.strategyProblem) {
        expect(
          lines.some((l) => l.id === id && l.msg === "retry strategy returned an unusable delay"),
          c.name,
        ).toBe(true);
      }
    }
  });

  it("runs every case through the harness", async () => {
    for (const [i, c] of CASES.entries()) {
      const b = c.before ?? {};
      const attempts = b.attempts ?? 0;
      let saw: Seen | undefined;
      const run = testHandler(
        {
          ...c.settings,
          handler: (p: unknown, m: MessageContext) => {
            saw = seen(m);
            return c.handler(p, m);
          },
        },
        { ...WORKER, queue: queueName(i) },
      );
      const clock = createManualClock();
      const pending = run(payloadOf(c), {
        id: ids[i],
        attempts,
        failures: b.failures ?? attempts,
        deliveries: (b.deliveries ?? attempts) + 1,
        key: b.key ?? null,
        headers: b.headers ?? {},
        ...(b.firstAttemptAt
          ? { firstAttemptAt: b.firstAttemptAt, lastAttemptAt: b.lastAttemptAt ?? null }
          : {}),
        clock,
      });
      // Let a handler that finishes at once finish; then whatever still runs meets its timeout.
      await new Promise((resolve) => setImmediate(resolve));
      clock.advance(c.settings?.timeoutMs ?? 300_000);
      const outcome = await pending;
      harness.set(i, {
        written: fromHarness(outcome),
        seen: saw,
        problem: outcome.kind !== "acked" && outcome.kind !== "lost" && outcome.strategyProblem !== undefined,
      });
    }
  });

  it.each(CASES.map((c, i) => [c.name, i] as const))("%s", (_name, i) => {
    const c = CASES[i] as Case;
    const w = worker.get(i);
    const h = harness.get(i);
    expect(w, "the worker ran this case").toBeDefined();
    expect(h, "the harness ran this case").toBeDefined();
    if (!w || !h) return;
    expect(h.seen, "the handler saw the same message").toEqual(w.seen);
    expect(h.problem, "strategy problem reported").toBe(c.strategyProblem === true);
    if (c.delayBetween && w.written.kind === "retried" && h.written.kind === "retried") {
      const [min, max] = c.delayBetween;
      for (const side of [w.written, h.written]) {
        expect(side.delayMs).toBeGreaterThanOrEqual(min);
        expect(side.delayMs).toBeLessThanOrEqual(max);
      }
      expect({ ...h.written, delayMs: 0 }).toEqual({ ...w.written, delayMs: 0 });
      return;
    }
    expect(h.written).toEqual(w.written);
  });

  it("covers every outcome kind, a timeout and a follow-up (a table that drifted to one kind proves little)", () => {
    const kinds = new Set([...worker.values()].map((w) => w.written.kind));
    expect([...kinds].sort()).toEqual(["acked", "dead", "retried"]);
    const written = [...worker.values()].map((w) => w.written);
    expect(written.some((w) => w.kind === "retried" && w.timedOut)).toBe(true);
    expect(written.some((w) => w.kind === "dead" && w.reason === "timeout")).toBe(true);
    expect(written.some((w) => w.kind === "acked" && w.followUps.length === 3)).toBe(true);
    expect(new Set(written.flatMap((w) => (w.kind === "dead" ? [w.reason] : [])))).toEqual(
      new Set(["rejected", "retries_exhausted", "invalid_payload", "max_deliveries", "timeout"]),
    );
  });
});

/**
 * One topic event, several subscribers, each ending its own way: the copies the database fans out and the
 * workers decide, against testTopic's outcomes for the same handlers and the same event.
 */
describe("the topic harness agrees with the fan-out and the worker", () => {
  const topic = defineTopic(
    "hag.order.placed",
    z.object({ orderId: z.string(), total: z.number(), currency: z.string().default("EUR") }),
  );
  const strict = defineQueue(
    "sub-strict",
    z.object({ orderId: z.string().startsWith("o-"), total: z.number() }),
  );
  const subscribers: Record<string, QueueConfig> = {
    "sub-billing": {
      subscribe: ["hag.order.placed"],
      handler: fail(new PermanentError("card declined")),
    },
    "sub-email": {
      subscribe: ["hag.order.*"],
      handler: (p, m) => {
        m.publish(`fu-${m.queue}`, { receipt: (p as { orderId: string }).orderId }, { key: "r" });
      },
    },
    "sub-search": { subscribe: ["hag.#"], handler: fail(new TransientError("index busy")) },
    "sub-strict": { subscribe: ["hag.order.placed"], schema: strict.schema as z.ZodType, handler: () => {} },
    // Subscribed to other topics only: no copy on either side.
    "sub-payments": { subscribe: ["hag.payment.*"], handler: fail(new Error("must not run")) },
  };
  const payload = { orderId: "x-9", total: 12 };
  const event = { key: "customer-7", headers: { tenant: "acme" } };
  const worker = new Map<string, { written: Written; seen: Seen | undefined }>();

  it("through the database and a real worker", { timeout: 180_000 }, async () => {
    await db.migrate();
    for (const [queue, config] of Object.entries(subscribers))
      for (const pattern of config.subscribe ?? [])
        await subscribe(db.pool, { schema: db.schema, topic: pattern, queue });
    const published = await db.inTransaction((client) =>
      outbox.publishToTopic(client, topic, payload, event),
    );
    const copies = new Map(published.messages.map((m) => [m.queue, String(m.id)]));
    const seenBy = new Map<string, Seen>();
    const events = new Map<string, { transient: boolean; timedOut: boolean }>();
    const w = createWorker({
      connection: db.url,
      schema: db.schema,
      minPollIntervalMs: 20,
      maxPollIntervalMs: 200,
      ...WORKER,
      queues: Object.fromEntries(
        Object.entries(subscribers).map(([queue, config]) => [
          queue,
          {
            ...config,
            handler: (p: unknown, m: MessageContext) => {
              seenBy.set(m.queue, seen(m));
              return config.handler(p, m);
            },
          },
        ]),
      ),
      logger: false,
    });
    w.on("retried", (e) => events.set(e.id, { transient: e.transient, timedOut: e.timedOut }));
    stopLater.push(w);
    await w.start();
    await settled([...copies.values()]);
    await w.stop();
    for (const [queue, id] of copies)
      worker.set(queue, { written: await writtenFor(id, `fu-${queue}`, events), seen: seenBy.get(queue) });
  });

  it("through testTopic, and both reach the same verdict for every subscriber", async () => {
    expect(worker.size, "the worker side ran").toBeGreaterThan(0);
    const clock = createManualClock();
    const seenBy = new Map<string, Seen>();
    const run = testTopic(
      Object.fromEntries(
        Object.entries(subscribers).map(([queue, config]) => [
          queue,
          {
            ...config,
            handler: (p: unknown, m: MessageContext) => {
              seenBy.set(m.queue, seen(m));
              return config.handler(p, m);
            },
          },
        ]),
      ),
      WORKER,
    );
    const pending = run(topic, payload, { ...event, clock });
    await new Promise((resolve) => setImmediate(resolve));
    clock.advance(300_000);
    const outcomes = await pending;
    // The same subscribers got a copy: every matching queue, and not sub-payments.
    expect(Object.keys(outcomes).sort()).toEqual([...worker.keys()].sort());
    expect(Object.keys(outcomes).sort()).toEqual(["sub-billing", "sub-email", "sub-search", "sub-strict"]);
    for (const [queue, outcome] of Object.entries(outcomes)) {
      const w = worker.get(queue);
      expect(seenBy.get(queue), `${queue}: the handler saw the same message`).toEqual(w?.seen);
      expect(fromHarness(outcome), `${queue}: the same verdict`).toEqual(w?.written);
    }
    // Each its own way: a table drifted to one kind proves little.
    expect(Object.values(outcomes).map((o) => (o.kind === "dead" ? o.reason : o.kind))).toEqual([
      "rejected",
      "acked",
      "retried",
      "invalid_payload",
    ]);
  });
});
