import { describe, expect, it, vi } from "vitest";
import { z } from "zod";
import { OutboxConfigError, OutboxError } from "../../src/contract/errors.js";
import { followUp } from "../../src/contract/follow-up.js";
import type { MessageContext } from "../../src/contract/handler.js";
import { PermanentError, TransientError } from "../../src/contract/handler-errors.js";
import { HandlerTimeoutError } from "../../src/dispatch/timeout.js";
import { defineQueue } from "../../src/produce/queue.js";
import { constant } from "../../src/retry/strategies.js";
import { createManualClock, type TestOutcome, testHandler } from "../../src/testing/index.js";
import { handle } from "../../src/worker/options.js";

/** The pure half of the harness's proof: every outcome kind, on a clock no test waits for. */

const orders = defineQueue("orders", z.object({ orderId: z.string(), total: z.number().int() }));
const never = () => new Promise<void>(() => {});
const fails = (error: unknown) => () => {
  throw error;
};

function expectKind<K extends TestOutcome["kind"]>(
  outcome: TestOutcome,
  kind: K,
): Extract<TestOutcome, { kind: K }> {
  expect(outcome.kind, JSON.stringify(outcome)).toBe(kind);
  return outcome as Extract<TestOutcome, { kind: K }>;
}

describe("acked", () => {
  it("hands the handler the validated payload and a context the test shaped", async () => {
    const clock = createManualClock(Date.UTC(2026, 5, 1));
    let seen: { payload: unknown; message: Record<string, unknown> } | undefined;
    const run = testHandler(
      handle(orders, (payload, message) => {
        seen = { payload, message: pick(message) };
      }),
      { queue: "orders", clock },
    );
    const createdAt = new Date(Date.UTC(2026, 4, 1));
    const outcome = await run(
      { orderId: "o-1", total: 5, extra: "stripped by the schema" },
      { id: "42", key: "customer-7", headers: { tenant: "a" }, attempts: 2, deliveries: 4, createdAt },
    );
    expect(outcome).toEqual({ kind: "acked", followUps: [], durationMs: 0 });
    expect(seen?.payload).toEqual({ orderId: "o-1", total: 5 });
    expect(seen?.message).toMatchObject({
      id: "42",
      queue: "orders",
      key: "customer-7",
      headers: { tenant: "a" },
      attempts: 2,
      deliveries: 4,
      createdAt,
      rawPayload: JSON.stringify({ orderId: "o-1", total: 5, extra: "stripped by the schema" }),
    });
  });

  it("defaults the context to a fresh first delivery at the clock's now", async () => {
    const clock = createManualClock(Date.UTC(2026, 0, 2));
    let message: MessageContext | undefined;
    await testHandler(
      (_p, m) => {
        message = m;
      },
      { clock },
    )({ a: 1 });
    expect(pick(message as MessageContext)).toMatchObject({
      id: "1",
      queue: "test",
      key: null,
      headers: {},
      attempts: 0,
      deliveries: 1,
      createdAt: new Date(Date.UTC(2026, 0, 2)),
    });
    expect(message?.signal.aborted).toBe(false);
  });

  it("reports the run time on the clock", async () => {
    const clock = createManualClock();
    let release = () => {};
    const run = testHandler(() => new Promise<void>((r) => (release = r)), { clock });
    const pending = run({});
    clock.advance(1500);
    release();
    expect(await pending).toMatchObject({ kind: "acked", durationMs: 1500 });
  });

  it("reports follow-ups published and returned, as their consumer would receive them", async () => {
    const shipments = defineQueue("shipments", z.object({ orderId: z.string(), at: z.coerce.date() }));
    const run = testHandler(
      handle(orders, async (order, message) => {
        message.publish("audit", { seen: order.orderId }, { headers: { by: "test" } });
        return [
          followUp(shipments, { orderId: order.orderId, at: new Date(Date.UTC(2026, 1, 1)) }, { key: "k" }),
          followUp("emails", { to: "x@example.com" }, { delayMs: 5000 }),
        ];
      }),
    );
    const acked = expectKind(await run({ orderId: "o-2", total: 1 }), "acked");
    expect(acked.followUps).toEqual([
      expect.objectContaining({ queue: "audit", payload: { seen: "o-2" }, key: null, delayMs: null }),
      expect.objectContaining({
        queue: "shipments",
        payload: { orderId: "o-2", at: "2026-02-01T00:00:00.000Z" },
        key: "k",
        availableAt: null,
      }),
      expect.objectContaining({ queue: "emails", payload: { to: "x@example.com" }, delayMs: 5000 }),
    ]);
    expect(acked.followUps[0]?.headers).toMatchObject({ by: "test" });
  });

  it("fails the attempt when a returned follow-up is invalid", async () => {
    const shipments = defineQueue("shipments", z.object({ orderId: z.string() }));
    const run = testHandler(() => followUp(shipments, { orderId: 7 } as never), { retry: constant(10) });
    const retried = expectKind(await run({}), "retried");
    expect(retried.error).toMatch(/OutboxPayloadError.*orderId/);
  });
});

describe("publish after the handler returned", () => {
  it("throws, as the worker's context does: the outcome is already decided", async () => {
    let late: MessageContext | undefined;
    const outcome = await testHandler((_p, m) => {
      late = m;
    })({});
    expect(outcome).toMatchObject({ kind: "acked", followUps: [] });
    expect(() => late?.publish("too-late", {})).toThrow("message.publish called after the handler returned");
    expect(() => late?.publish("too-late", {})).toThrow(OutboxError);
  });
});

describe("retried", () => {
  it("counts an unclassified failure, with the strategy's delay from the clock's now", async () => {
    const clock = createManualClock(Date.UTC(2026, 0, 1));
    const run = testHandler(
      { handler: fails(new Error("boom")), retry: constant(2500), maxAttempts: 5 },
      { clock },
    );
    expect(await run({}, { attempts: 2 })).toEqual({
      kind: "retried",
      delayMs: 2500,
      availableAt: new Date(Date.UTC(2026, 0, 1) + 2500),
      countsTowardsMaxAttempts: true,
      transient: false,
      timedOut: false,
      error: "Error: boom",
      attempts: 3,
      failures: 3,
    });
  });

  it("does not count a transient failure, even one short of maxAttempts", async () => {
    const run = testHandler({
      handler: fails(new TransientError("busy")),
      maxAttempts: 3,
      retry: constant(7),
    });
    const retried = expectKind(await run({}, { attempts: 5, failures: 2 }), "retried");
    expect(retried).toMatchObject({
      countsTowardsMaxAttempts: false,
      transient: true,
      attempts: 6,
      failures: 2,
    });
    // The same place with an unclassified error is the last attempt.
    const counted = testHandler({ handler: fails(new Error("x")), maxAttempts: 3 });
    expect(await counted({}, { attempts: 5, failures: 2 })).toMatchObject({
      kind: "dead",
      reason: "retries_exhausted",
    });
  });

  it("treats a network error (ECONNRESET) as transient, as the worker's classification does", async () => {
    const error = Object.assign(new Error("socket hang up"), { code: "ECONNRESET" });
    expect(await testHandler(fails(error))({})).toMatchObject({ kind: "retried", transient: true });
  });

  it("runs the strategy with the attempt's context; a garbage answer gets the default backoff", async () => {
    const first = new Date(Date.UTC(2026, 0, 1));
    const last = new Date(Date.UTC(2026, 0, 2));
    const strategy = vi.fn(() => "soon" as never);
    const run = testHandler({ handler: fails(new Error("e")), retry: strategy });
    const retried = expectKind(
      await run({}, { attempts: 1, failures: 0, firstAttemptAt: first, lastAttemptAt: last }),
      "retried",
    );
    expect(strategy).toHaveBeenCalledWith(
      expect.objectContaining({ attempts: 2, failures: 1, firstAttemptAt: first, lastAttemptAt: last }),
    );
    // The default: exponential from 1 s with equal jitter; attempt 2 waits between 1 and 2 s.
    expect(retried.delayMs).toBeGreaterThanOrEqual(1000);
    expect(retried.delayMs).toBeLessThanOrEqual(2000);
    expect(retried.strategyProblem).toMatch(/retry strategy returned "soon"/);
  });

  it("uses the worker-level strategy when the queue has none, and the queue's over it", async () => {
    const workerLevel = testHandler(fails(new Error("e")), { retry: constant(111) });
    expect(await workerLevel({})).toMatchObject({ kind: "retried", delayMs: 111 });
    const queueLevel = testHandler(
      { handler: fails(new Error("e")), retry: constant(222) },
      { retry: constant(111) },
    );
    expect(await queueLevel({})).toMatchObject({ kind: "retried", delayMs: 222 });
  });

  it("writes the error the way the worker does: cause chain, cut to maxErrorLength", async () => {
    const error = new Error("x".repeat(500), { cause: new Error("root") });
    const retried = expectKind(await testHandler(fails(error), { maxErrorLength: 100 })({}), "retried");
    expect(retried.error).toHaveLength(100);
    expect(retried.error.endsWith("…")).toBe(true);
    const short = expectKind(await testHandler(fails(new Error("top", { cause: "why" })))({}), "retried");
    expect(short.error).toBe("Error: top\ncaused by: why");
  });
});

describe("dead", () => {
  it("rejects a PermanentError at once, whatever the attempts left", async () => {
    const run = testHandler({ handler: fails(new PermanentError("bad order")), maxAttempts: 50 });
    expect(await run({})).toEqual({
      kind: "dead",
      reason: "rejected",
      error: "PermanentError: bad order",
      attempts: 1,
      failures: 1,
    });
  });

  it("exhausts retries at maxAttempts: the queue's, else the worker's, else 10", async () => {
    const handler = fails(new Error("e"));
    expect(await testHandler({ handler, maxAttempts: 3 })({}, { attempts: 2 })).toMatchObject({
      kind: "dead",
      reason: "retries_exhausted",
      attempts: 3,
      failures: 3,
    });
    expect(await testHandler({ handler }, { maxAttempts: 3 })({}, { attempts: 2 })).toMatchObject({
      kind: "dead",
    });
    expect(await testHandler(handler)({}, { attempts: 8 })).toMatchObject({ kind: "retried" });
    expect(await testHandler(handler)({}, { attempts: 9 })).toMatchObject({ kind: "dead" });
  });

  it('dead-letters when the strategy says "stop", without counting a transient failure', async () => {
    const run = testHandler({ handler: fails(new TransientError("t")), retry: () => "stop" });
    expect(await run({}, { attempts: 1, failures: 1 })).toEqual({
      kind: "dead",
      reason: "retries_exhausted",
      error: "TransientError: t",
      attempts: 2,
      failures: 1,
    });
  });

  it("refuses a payload the schema rejects without running the handler (invalid_payload)", async () => {
    const handler = vi.fn();
    const outcome = await testHandler(handle(orders, handler))({ orderId: 1 });
    expect(outcome).toEqual({
      kind: "dead",
      reason: "invalid_payload",
      error: expect.stringMatching(/^orderId: .*; total: /),
      attempts: 0,
      failures: 0,
    });
    expect(handler).not.toHaveBeenCalled();
  });

  it("refuses stored text that is not JSON (invalid_payload) and a crash-looping row (max_deliveries)", async () => {
    const handler = vi.fn();
    const run = testHandler(handler, { maxDeliveries: 3 });
    expect(await run(null, { rawPayload: "{not json" })).toMatchObject({
      kind: "dead",
      reason: "invalid_payload",
    });
    expect(await run({}, { deliveries: 4 })).toMatchObject({
      kind: "dead",
      reason: "max_deliveries",
      error: "leased 4 times, 3 of them ended without an outcome (max 3)",
      attempts: 0,
    });
    expect(await run({}, { deliveries: 3 })).toMatchObject({ kind: "acked" });
    expect(handler).toHaveBeenCalledTimes(1);
  });
});

describe("raw payload queues", () => {
  it("hand the handler the stored text, unparsed and unvalidated", async () => {
    let got: unknown;
    const run = testHandler({
      rawPayload: true,
      handler: (p) => {
        got = p;
      },
    });
    await run({ big: 1 }, { rawPayload: '{"big": 12345678901234567890}' });
    expect(got).toBe('{"big": 12345678901234567890}');
    await run([1, 2]);
    expect(got).toBe("[1,2]");
  });

  it("are refused with a schema, as createWorker refuses them", () => {
    expect(() => testHandler({ rawPayload: true, schema: z.string(), handler: () => {} })).toThrow(
      OutboxConfigError,
    );
  });
});

describe("timeouts on the manual clock", () => {
  it("times a hanging handler out when the clock passes timeoutMs, aborting its signal", async () => {
    const clock = createManualClock();
    let signal: AbortSignal | undefined;
    const run = testHandler(
      {
        timeoutMs: 30_000,
        retry: constant(1000),
        handler: (_p, m) => {
          signal = m.signal;
          return never();
        },
      },
      { clock },
    );
    const pending = run({});
    let settled = false;
    void pending.then(() => (settled = true));
    clock.advance(29_999);
    await Promise.resolve();
    expect(settled).toBe(false);
    expect(signal?.aborted).toBe(false);
    clock.advance(1);
    const retried = expectKind(await pending, "retried");
    expect(retried).toMatchObject({ timedOut: true, countsTowardsMaxAttempts: true, delayMs: 1000 });
    expect(retried.error).toBe("HandlerTimeoutError: handler did not finish within 30000 ms (timeout)");
    expect(signal?.reason).toBeInstanceOf(HandlerTimeoutError);
  });

  it("dead-letters the last timed-out attempt as timeout; the worker's handlerTimeoutMs is the default", async () => {
    const clock = createManualClock();
    const run = testHandler({ handler: never, maxAttempts: 2 }, { clock, handlerTimeoutMs: 500 });
    const pending = run({}, { attempts: 1 });
    clock.advance(500);
    expect(await pending).toMatchObject({ kind: "dead", reason: "timeout", attempts: 2, failures: 2 });
  });

  it("counts the timeout from the handler's start, its synchronous part included, as the worker's deadline does", async () => {
    const clock = createManualClock();
    const run = testHandler(
      {
        timeoutMs: 1000,
        handler: () => {
          clock.advance(600);
          return never();
        },
      },
      { clock },
    );
    const pending = run({});
    clock.advance(400);
    // Settled by the advance itself: a harness still waiting loses the race instead of hanging the test.
    expect(await Promise.race([pending, Promise.resolve("still running")])).toMatchObject({
      kind: "retried",
      timedOut: true,
    });
  });

  it("does not time out a synchronous handler, however long it took", async () => {
    const clock = createManualClock();
    const run = testHandler({ timeoutMs: 10, handler: () => clock.advance(1000) }, { clock });
    expect(await run({})).toEqual({ kind: "acked", followUps: [], durationMs: 1000 });
  });
});

describe("abort", () => {
  it("is a lost lease: the handler's signal aborts and the worker writes nothing", async () => {
    const lease = new AbortController();
    let signal: AbortSignal | undefined;
    const pending = testHandler((_p, m) => {
      signal = m.signal;
      return never();
    })({}, { abort: lease.signal, clock: createManualClock() });
    const reason = new Error("lease lost");
    lease.abort(reason);
    expect(await pending).toEqual({ kind: "lost", reason });
    expect(signal?.reason).toBe(reason);
  });

  it("does not run the handler when the lease is already lost", async () => {
    const handler = vi.fn();
    expect(await testHandler(handler)({}, { abort: AbortSignal.abort("gone") })).toEqual({
      kind: "lost",
      reason: "gone",
    });
    expect(handler).not.toHaveBeenCalled();
  });
});

describe("createManualClock", () => {
  it("fires timers in due order as it advances, and cancels them", () => {
    const clock = createManualClock(1000);
    const fired: string[] = [];
    clock.setTimeout(() => fired.push(`b@${clock.now()}`), 20);
    clock.setTimeout(() => fired.push(`a@${clock.now()}`), 10);
    const cancel = clock.setTimeout(() => fired.push("cancelled"), 15);
    cancel();
    clock.advance(15);
    expect(fired).toEqual(["a@1010"]);
    expect(clock.now()).toBe(1015);
    clock.advance(100);
    expect(fired).toEqual(["a@1010", "b@1020"]);
    expect(clock.now()).toBe(1115);
    expect(() => clock.advance(-1)).toThrow(OutboxConfigError);
  });
});

function pick(m: MessageContext) {
  const { id, queue, key, headers, attempts, deliveries, createdAt, rawPayload } = m;
  return { id, queue, key, headers, attempts, deliveries, createdAt, rawPayload };
}
