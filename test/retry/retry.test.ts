import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { OutboxConfigError } from "../../src/contract/errors.js";
import {
  backoffDelay,
  constant,
  decide,
  defaultRetry,
  exponential,
  giveUpAfter,
  linear,
  loopGiveUpMs,
  none,
  type RetryContext,
  type RetryStrategy,
} from "../../src/retry/strategies.js";

const HOUR = 3_600_000;
const WEEK = 7 * 24 * HOUR;

function ctx(attempts: number, extra: Partial<RetryContext> = {}): RetryContext {
  return {
    attempts,
    failures: attempts,
    firstAttemptAt: null,
    lastAttemptAt: null,
    error: new Error("x"),
    ...extra,
  };
}

const fixed = (r: number) => () => r;

/** Attempt counts from the first to far beyond any real backlog, where a naive factor ** n overflows. */
const attemptsArb = fc.oneof(
  fc.integer({ min: 1, max: 60 }),
  fc.integer({ min: 1, max: Number.MAX_SAFE_INTEGER }),
  fc.constantFrom(1024, 1025, 10_000, Number.MAX_SAFE_INTEGER, Number.MAX_VALUE, Number.POSITIVE_INFINITY),
);

const optsArb = fc.record({
  baseMs: fc.oneof(fc.integer({ min: 0, max: 100_000 }), fc.double({ min: 0, max: 1e6, noNaN: true })),
  factor: fc.oneof(fc.constantFrom(1, 1.0001, 1.5, 2, 3, 10), fc.double({ min: 1, max: 1000, noNaN: true })),
  maxMs: fc.oneof(fc.integer({ min: 0, max: WEEK }), fc.double({ min: 0, max: 1e12, noNaN: true })),
});

describe("exponential", () => {
  it("grows by the factor from baseMs and stops at maxMs (jitter none)", () => {
    const s = exponential({ baseMs: 100, factor: 3, maxMs: 5000, jitter: "none" });
    expect([1, 2, 3, 4, 5, 6].map((a) => s(ctx(a)))).toEqual([100, 300, 900, 2700, 5000, 5000]);
  });

  it("defaults to 1 s doubling, capped at one hour, with equal jitter", () => {
    const low = exponential({}, fixed(0));
    const high = exponential({}, fixed(1));
    expect([1, 2, 3].map((a) => low(ctx(a)))).toEqual([500, 1000, 2000]);
    expect([1, 2, 3].map((a) => high(ctx(a)))).toEqual([1000, 2000, 4000]);
    expect(high(ctx(13))).toBe(HOUR);
    expect(low(ctx(10_000))).toBe(HOUR / 2);
  });

  it("uses full jitter between 0 and the delay", () => {
    const s = exponential({ baseMs: 1000, jitter: "full" }, fixed(0.25));
    expect(s(ctx(3))).toBe(1000);
  });

  it("never overflows: huge attempt counts give exactly maxMs", () => {
    for (const attempts of [10_000, Number.MAX_SAFE_INTEGER, Number.MAX_VALUE, Number.POSITIVE_INFINITY]) {
      expect(exponential({ jitter: "none" })(ctx(attempts))).toBe(HOUR);
      expect(exponential({ factor: 1e6, jitter: "none" })(ctx(attempts))).toBe(HOUR);
    }
    // A factor barely above 1 still reaches the cap, rather than being cut off at some exponent limit.
    const slow = exponential({ factor: 1.0001, maxMs: 5000, jitter: "none" });
    expect(slow(ctx(10_000))).toBeCloseTo(1000 * Math.E, -1);
    expect(slow(ctx(Number.MAX_SAFE_INTEGER))).toBe(5000);
  });

  it("treats an attempts count below 1 or NaN as the first attempt", () => {
    const s = exponential({ baseMs: 100, jitter: "none" });
    for (const attempts of [0, -5, Number.NaN, Number.NEGATIVE_INFINITY]) expect(s(ctx(attempts))).toBe(100);
  });

  it("does not let a broken random source poison the delay", () => {
    for (const r of [Number.NaN, -1, 2, Number.POSITIVE_INFINITY]) {
      const d = exponential({ baseMs: 1000 }, fixed(r))(ctx(1));
      expect(d).toBeGreaterThanOrEqual(500);
      expect(d).toBeLessThanOrEqual(1000);
    }
  });

  it("rejects unusable options when the strategy is built", () => {
    expect(() => exponential({ baseMs: -1 })).toThrow(OutboxConfigError);
    expect(() => exponential({ baseMs: Number.NaN })).toThrow(/baseMs/);
    expect(() => exponential({ maxMs: Number.POSITIVE_INFINITY })).toThrow(/maxMs/);
    expect(() => exponential({ factor: 0.5 })).toThrow(/factor/);
    expect(() => exponential({ jitter: "some" as "none" })).toThrow(/jitter/);
  });

  it("property: delays are finite and within [0, maxMs] for every jitter", () => {
    fc.assert(
      fc.property(
        optsArb,
        fc.constantFrom("full", "equal", "none") as fc.Arbitrary<"full" | "equal" | "none">,
        attemptsArb,
        fc.double({ min: 0, max: 1, noNaN: true }),
        (opts, jitter, attempts, r) => {
          const d = exponential({ ...opts, jitter }, fixed(r))(ctx(attempts));
          expect(typeof d).toBe("number");
          expect(Number.isFinite(d)).toBe(true);
          expect(d).toBeGreaterThanOrEqual(0);
          expect(d).toBeLessThanOrEqual(opts.maxMs);
        },
      ),
    );
  });

  it("property: without jitter the delay never decreases as attempts grow", () => {
    fc.assert(
      fc.property(optsArb, attemptsArb, attemptsArb, (opts, a, b) => {
        const s = exponential({ ...opts, jitter: "none" });
        const [lo, hi] = a <= b ? [a, b] : [b, a];
        expect(s(ctx(lo))).toBeLessThanOrEqual(s(ctx(hi)) as number);
      }),
    );
  });

  it("property: consecutive attempts without jitter never decrease", () => {
    fc.assert(
      fc.property(optsArb, fc.integer({ min: 1, max: 2000 }), (opts, a) => {
        const s = exponential({ ...opts, jitter: "none" });
        expect(s(ctx(a))).toBeLessThanOrEqual(s(ctx(a + 1)) as number);
      }),
    );
  });

  it("property: equal jitter stays within [d/2, d] of the unjittered delay d", () => {
    fc.assert(
      fc.property(optsArb, attemptsArb, fc.double({ min: 0, max: 1, noNaN: true }), (opts, attempts, r) => {
        const d = exponential({ ...opts, jitter: "none" })(ctx(attempts)) as number;
        const j = exponential({ ...opts, jitter: "equal" }, fixed(r))(ctx(attempts)) as number;
        expect(j).toBeGreaterThanOrEqual(d / 2);
        expect(j).toBeLessThanOrEqual(d);
      }),
    );
  });

  it("property: full jitter stays within [0, d]", () => {
    fc.assert(
      fc.property(optsArb, attemptsArb, fc.double({ min: 0, max: 1, noNaN: true }), (opts, attempts, r) => {
        const d = exponential({ ...opts, jitter: "none" })(ctx(attempts)) as number;
        const j = exponential({ ...opts, jitter: "full" }, fixed(r))(ctx(attempts)) as number;
        expect(j).toBeGreaterThanOrEqual(0);
        expect(j).toBeLessThanOrEqual(d);
      }),
    );
  });
});

describe("linear, constant, none", () => {
  it("linear is stepMs * attempts, capped", () => {
    const s = linear({ stepMs: 250, maxMs: 1000 });
    expect([1, 2, 3, 4, 5, 100].map((a) => s(ctx(a)))).toEqual([250, 500, 750, 1000, 1000, 1000]);
    expect(linear()(ctx(3))).toBe(3000);
    expect(linear()(ctx(10_000))).toBe(HOUR);
  });

  it("linear stays finite for any attempt count, also with stepMs 0", () => {
    for (const attempts of [
      Number.MAX_SAFE_INTEGER,
      Number.MAX_VALUE,
      Number.POSITIVE_INFINITY,
      Number.NaN,
    ]) {
      expect(Number.isFinite(linear({ stepMs: 7 })(ctx(attempts)))).toBe(true);
      expect(linear({ stepMs: 0 })(ctx(attempts))).toBe(0);
    }
  });

  it("property: linear is within [0, maxMs] and non-decreasing", () => {
    fc.assert(
      fc.property(
        fc.integer({ min: 0, max: 100_000 }),
        fc.integer({ min: 0, max: WEEK }),
        attemptsArb,
        attemptsArb,
        (stepMs, maxMs, a, b) => {
          const s = linear({ stepMs, maxMs });
          const [lo, hi] = a <= b ? [a, b] : [b, a];
          const dLo = s(ctx(lo)) as number;
          const dHi = s(ctx(hi)) as number;
          expect(dLo).toBeGreaterThanOrEqual(0);
          expect(dHi).toBeLessThanOrEqual(maxMs);
          expect(dLo).toBeLessThanOrEqual(dHi);
        },
      ),
    );
  });

  it("constant and none ignore the attempt count", () => {
    expect(constant(1234)(ctx(1))).toBe(1234);
    expect(constant(1234)(ctx(99))).toBe(1234);
    expect(none()(ctx(5))).toBe(0);
    expect(() => constant(-1)).toThrow(OutboxConfigError);
    expect(() => constant(Number.NaN)).toThrow(OutboxConfigError);
    expect(() => linear({ stepMs: -1 })).toThrow(OutboxConfigError);
  });

  it("defaultRetry is the default exponential: [500, 1000] ms after the first attempt", () => {
    for (let i = 0; i < 50; i++) {
      const d = defaultRetry(ctx(1)) as number;
      expect(d).toBeGreaterThanOrEqual(500);
      expect(d).toBeLessThanOrEqual(1000);
    }
    expect(defaultRetry(ctx(40))).toBeGreaterThanOrEqual(HOUR / 2);
  });
});

describe("giveUpAfter", () => {
  it("keeps the inner strategy's delays until maxElapsedMs since the first attempt, then stops", () => {
    const first = new Date(1_000_000);
    const s = giveUpAfter(HOUR, constant(5), () => first.getTime() + HOUR - 1);
    expect(s(ctx(3, { firstAttemptAt: first }))).toBe(5);
    const late = giveUpAfter(HOUR, constant(5), () => first.getTime() + HOUR);
    expect(late(ctx(3, { firstAttemptAt: first }))).toBe("stop");
  });

  it("bounds nothing without a finite first attempt time", () => {
    const s = giveUpAfter(0, constant(5), () => 1e15);
    expect(s(ctx(1, { firstAttemptAt: null }))).toBe(5);
    expect(s(ctx(1, { firstAttemptAt: new Date(Number.NaN) }))).toBe(5);
  });

  it("refuses a bound that is not a finite number >= 0", () => {
    expect(() => giveUpAfter(-1)).toThrow(OutboxConfigError);
    expect(() => giveUpAfter(Number.NaN)).toThrow(/maxElapsedMs/);
  });
});

describe("decide", () => {
  it("passes whole-ms delays and 'stop' through without a problem", () => {
    expect(decide(constant(1500), ctx(1))).toEqual({ decision: 1500 });
    expect(decide(() => "stop", ctx(1))).toEqual({ decision: "stop" });
    expect(decide(none(), ctx(1))).toEqual({ decision: 0 });
  });

  it("rounds to whole ms, turns -0 into 0 and caps at maxDelayMs (default 7 days)", () => {
    expect(decide(() => 12.6, ctx(1)).decision).toBe(13);
    expect(Object.is(decide(() => -0, ctx(1)).decision, 0)).toBe(true);
    expect(decide(() => 30 * 24 * HOUR, ctx(1))).toEqual({ decision: WEEK });
    expect(decide(() => 5000, ctx(1), 2000)).toEqual({ decision: 2000 });
  });

  it("hands the strategy the context it was given", () => {
    const seen: RetryContext[] = [];
    const c = ctx(4, { failures: 2 });
    decide((x) => {
      seen.push(x);
      return 1;
    }, c);
    expect(seen).toEqual([c]);
  });

  const bad: [string, RetryStrategy, RegExp][] = [
    ["NaN", () => Number.NaN, /returned NaN/],
    ["a negative number", () => -5, /returned -5/],
    ["Infinity", () => Number.POSITIVE_INFINITY, /returned Infinity/],
    ["a string", () => "soon" as unknown as number, /returned "soon"/],
    ["undefined", () => undefined as unknown as number, /returned a value of type undefined/],
    ["null", () => null as unknown as number, /returned null/],
    [
      "a throw",
      () => {
        throw new TypeError("boom");
      },
      /threw \(TypeError: boom\)/,
    ],
    [
      "a thrown non-error",
      () => {
        throw null;
      },
      /threw \(null\)/,
    ],
    ["a Promise", (async () => 5) as unknown as RetryStrategy, /Promise/],
  ];

  it.each(bad)(
    "falls back to the default backoff and reports a strategy returning %s",
    (_, strategy, problem) => {
      const out = decide(strategy, ctx(1));
      expect(out.problem).toMatch(problem);
      expect(out.problem).toMatch(/default backoff/);
      expect(typeof out.decision).toBe("number");
      expect(out.decision).toBeGreaterThanOrEqual(500);
      expect(out.decision).toBeLessThanOrEqual(1000);
      expect(Number.isInteger(out.decision)).toBe(true);
    },
  );

  it("caps the fallback too and survives a rejected async strategy without an unhandled rejection", async () => {
    const unhandled: unknown[] = [];
    const onUnhandled = (reason: unknown) => unhandled.push(reason);
    process.on("unhandledRejection", onUnhandled);
    try {
      const out = decide(
        (async () => {
          throw new Error("async boom");
        }) as unknown as RetryStrategy,
        ctx(30),
        10,
      );
      expect(out.decision).toBe(10);
      // Node reports a rejection still unhandled at the end of the event-loop turn it happened in: one turn
      // later, an unobserved rejection would be in the list.
      await new Promise((resolve) => setImmediate(resolve));
      expect(unhandled).toEqual([]);
    } finally {
      process.off("unhandledRejection", onUnhandled);
    }
  });

  it("reports an unusable maxDelayMs and uses 7 days instead", () => {
    const out = decide(() => 30 * 24 * HOUR, ctx(1), Number.NaN);
    expect(out.decision).toBe(WEEK);
    expect(out.problem).toMatch(/maxDelayMs/);
  });

  it("property: every decision is 'stop' or a whole number of ms in [0, maxDelayMs]", () => {
    const anything = fc.oneof(
      fc.double(),
      fc.integer(),
      fc.constantFrom("stop", "later", null, undefined, {}, [], -0, Number.MAX_VALUE),
    );
    fc.assert(
      fc.property(
        anything,
        fc.boolean(),
        attemptsArb,
        fc.integer({ min: 0, max: WEEK }),
        (value, throws, a, cap) => {
          const strategy = (() => {
            if (throws) throw value;
            return value;
          }) as RetryStrategy;
          const { decision, problem } = decide(strategy, ctx(a), cap);
          if (decision === "stop") {
            expect(value).toBe("stop");
            expect(throws).toBe(false);
            return;
          }
          expect(Number.isInteger(decision)).toBe(true);
          expect(decision).toBeGreaterThanOrEqual(0);
          expect(decision).toBeLessThanOrEqual(cap);
          const valid = !throws && typeof value === "number" && Number.isFinite(value) && value >= 0;
          expect(problem === undefined).toBe(valid);
        },
      ),
    );
  });
});

describe("loopGiveUpMs", () => {
  it("is the sum of the shortest backoffs between a run's failures: 116,350 ms for 30 at the defaults", () => {
    const opts = { baseMs: 100, maxMs: 10_000 };
    const shortest = (n: number) => {
      let total = 0;
      for (let a = 1; a < n; a++) total += backoffDelay(a, { ...opts, random: fixed(0) });
      return total;
    };
    expect(loopGiveUpMs(30, opts)).toBe(116_350);
    for (const n of [1, 2, 3, 8, 9, 30, 100]) expect(loopGiveUpMs(n, opts)).toBe(shortest(n));
    // A million failures (the option's maximum) without a million-step loop; no overflow.
    expect(loopGiveUpMs(1_000_000, opts)).toBe(6350 + (1_000_000 - 8) * 5000);
    expect(loopGiveUpMs(5, { baseMs: 0, maxMs: 10_000 })).toBe(0);
  });
});

describe("backoffDelay", () => {
  it("starts at about baseMs and doubles up to maxMs", () => {
    const lo = (a: number) => backoffDelay(a, { baseMs: 100, maxMs: 10_000, random: fixed(0) });
    const hi = (a: number) => backoffDelay(a, { baseMs: 100, maxMs: 10_000, random: fixed(1) });
    expect([1, 2, 3, 8, 9].map(hi)).toEqual([100, 200, 400, 10_000, 10_000]);
    expect([1, 2, 3].map(lo)).toEqual([50, 100, 200]);
  });

  it("never overflows", () => {
    for (const a of [10_000, Number.MAX_SAFE_INTEGER, Number.POSITIVE_INFINITY]) {
      expect(backoffDelay(a, { baseMs: 100, maxMs: 10_000, random: fixed(1) })).toBe(10_000);
    }
    expect(backoffDelay(Number.NaN, { baseMs: 100, maxMs: 10_000, random: fixed(1) })).toBe(100);
  });

  it("rejects unusable options", () => {
    expect(() => backoffDelay(1, { baseMs: Number.NaN, maxMs: 10 })).toThrow(OutboxConfigError);
    expect(() => backoffDelay(1, { baseMs: 1, maxMs: -1 })).toThrow(OutboxConfigError);
  });

  it("property: finite, within [d/2, d] of the unjittered delay, and at most maxMs", () => {
    fc.assert(
      fc.property(
        fc.integer({ min: 0, max: 60_000 }),
        fc.integer({ min: 0, max: 600_000 }),
        attemptsArb,
        fc.double({ min: 0, max: 1, noNaN: true }),
        (baseMs, maxMs, attempt, r) => {
          const d = backoffDelay(attempt, { baseMs, maxMs, random: fixed(1) });
          const j = backoffDelay(attempt, { baseMs, maxMs, random: fixed(r) });
          expect(Number.isFinite(j)).toBe(true);
          expect(d).toBeLessThanOrEqual(maxMs);
          expect(d).toBe(
            baseMs === 0 ? 0 : Math.min(maxMs, attempt <= 64 ? baseMs * 2 ** (attempt - 1) : maxMs),
          );
          expect(j).toBeGreaterThanOrEqual(d / 2);
          expect(j).toBeLessThanOrEqual(d);
        },
      ),
    );
  });
});
