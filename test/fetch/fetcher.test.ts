import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { Fetcher } from "../../src/fetch/fetcher.js";

/**
 * The fetcher's poll schedule, on fake timers: every lease() call is stamped with the fake clock, so the
 * gaps between fetches are the delays the fetcher scheduled, exactly. Nothing here waits for real time.
 */

/** What one lease() call does: return this many rows, or throw; `more`: the store says more are waiting. */
type Step = number | Error | { rows: number; more: true };

function harness(options: {
  random: () => number;
  /** Steps by call; calls past the end find no rows. */
  steps?: Step[];
  minPollMs?: number;
  maxPollMs?: number;
  backoffBaseMs?: number;
  backoffMaxMs?: number;
  maxConsecutiveFailures?: number;
  /** LISTEN delivers wake-ups (default true): only then do empty polls back off towards maxPollMs. */
  wakeUps?: boolean;
  minBatch?: number;
  batchSize?: number;
  /** Free local slots (default 10). */
  free?: number;
  /** The fetcher's monotonic clock (default: the fake Date's). */
  now?: () => number;
}) {
  const steps = options.steps ?? [];
  const at: number[] = [];
  const errors: number[] = [];
  const fatal: Error[] = [];
  const limits: number[] = [];
  const t0 = Date.now();
  const fetcher = new Fetcher<number>({
    batchSize: options.batchSize ?? 10,
    minBatch: options.minBatch,
    minPollMs: options.minPollMs ?? 100,
    maxPollMs: options.maxPollMs ?? 1000,
    backoffBaseMs: options.backoffBaseMs ?? 100,
    backoffMaxMs: options.backoffMaxMs ?? 400,
    maxConsecutiveFailures: options.maxConsecutiveFailures ?? 1000,
    free: () => options.free ?? 10,
    lease: async (limit) => {
      const step = steps[at.length] ?? 0;
      at.push(Date.now() - t0);
      limits.push(limit);
      if (step instanceof Error) throw step;
      const n = typeof step === "number" ? step : step.rows;
      const rows = Array.from({ length: Math.min(n, limit) }, (_, i) => i);
      return typeof step === "number" ? { rows } : { rows, more: step.more };
    },
    deliver: () => {},
    onError: (_error, consecutive) => void errors.push(consecutive),
    onFatal: (error) => void fatal.push(error),
    random: options.random,
    now: options.now ?? (() => Date.now()),
  });
  fetcher.setWakeUps(options.wakeUps ?? true);
  return {
    fetcher,
    /** The limit of each lease() call. */
    limits,
    errors,
    fatal,
    /** When each fetch ran, in ms after the start. */
    at,
    /** The wait before each fetch after the first: the delays the fetcher scheduled. */
    gaps: () => at.slice(1).map((t, i) => t - (at[i] ?? 0)),
  };
}

const fixed = (r: number) => () => r;
const boom = () => new Error("connection refused");

beforeEach(() => {
  // setImmediate stays real: faked, one scheduled from inside a timer callback would run 1 ms later.
  vi.useFakeTimers({ toFake: ["setTimeout", "clearTimeout", "Date"] });
});
afterEach(() => {
  vi.useRealTimers();
});

/** Start the fetchers and let `ms` of fake time pass, running every timer and promise due in it. */
async function runFor(ms: number, ...fetchers: Fetcher<number>[]) {
  for (const f of fetchers) f.start();
  await vi.advanceTimersByTimeAsync(ms);
  await Promise.all(fetchers.map((f) => f.stop()));
}

describe("Fetcher poll schedule", () => {
  it("empty fetches double the poll interval from minPollMs up to maxPollMs", async () => {
    const h = harness({ random: fixed(1) }); // 1: the jitter factor is exactly 1
    await runFor(6000, h.fetcher);
    expect(h.gaps().slice(0, 7)).toEqual([200, 400, 800, 1000, 1000, 1000, 1000]);
  });

  it("a fetch that finds rows resets the poll interval to minPollMs; a full batch fetches again at once", async () => {
    // Back off to the maximum, find one row (not a full batch), nothing twice, two full batches, a partial one.
    const h = harness({ random: fixed(1), steps: [0, 0, 0, 0, 0, 1, 0, 0, 10, 10, 3, 0] });
    await runFor(6000, h.fetcher);
    const gaps = h.gaps();
    expect(gaps.slice(0, 5), "empty fetches back off to maxPollMs").toEqual([200, 400, 800, 1000, 1000]);
    expect(gaps[5], "found a row: the next poll comes at minPollMs").toBe(100);
    expect(gaps.slice(6, 8), "empty again: doubling from the minimum").toEqual([200, 400]);
    expect(gaps.slice(8, 10), "a full batch (10 of 10): fetch again at once, no poll wait").toEqual([0, 0]);
    expect(gaps[10], "a batch that is not full ends the run: poll at the minimum").toBe(100);
  });

  it("jitters each delay up to 20 % early, never late (random 0 → 0.8×, random 1 → 1×), so two workers do not poll in lockstep", async () => {
    const low = harness({ random: fixed(0) });
    const high = harness({ random: fixed(1) });
    await runFor(6000, low.fetcher, high.fetcher);
    expect(low.gaps().slice(0, 6)).toEqual([160, 320, 640, 800, 800, 800]);
    expect(high.gaps().slice(0, 6)).toEqual([200, 400, 800, 1000, 1000, 1000]);
    // Started together, they fetched together once, at the start, and never again.
    const together = low.at.filter((t) => high.at.includes(t));
    expect(together).toEqual([0]);
  });

  it("a failed fetch backs off exponentially (capped, jittered) and the poll resumes after a success", async () => {
    const h = harness({
      random: fixed(1),
      backoffBaseMs: 100,
      backoffMaxMs: 400,
      steps: [boom(), boom(), boom(), boom(), 0, 0],
    });
    await runFor(3000, h.fetcher);
    // backoff: equal jitter over 100, 200, 400, 400 at random 1 = the full delays (schedule jitter 1×).
    expect(h.gaps().slice(0, 6)).toEqual([100, 200, 400, 400, 200, 400]);
    expect(h.errors).toEqual([1, 2, 3, 4]);
    expect(h.fatal).toEqual([]);

    const low = harness({ random: fixed(0), steps: [boom(), boom(), boom()] });
    await runFor(3000, low.fetcher);
    // random 0: half of 100, 200, 400, and no poll jitter on top (loopGiveUpMs counts on these halves).
    expect(low.gaps().slice(0, 3)).toEqual([50, 100, 200]);
  });

  it("after maxConsecutiveFailures failed fetches in a row it reports fatal and fetches no more", async () => {
    const h = harness({
      random: fixed(1),
      maxConsecutiveFailures: 3,
      steps: [boom(), boom(), 0, boom(), boom(), boom(), 0],
    });
    await runFor(60_000, h.fetcher);
    // The success in between resets the count: fatal only at the third failure in a row.
    expect(h.errors).toEqual([1, 2, 1, 2, 3]);
    expect(h.fatal).toHaveLength(1);
    expect(h.at).toHaveLength(6);
  });

  it("without wake-ups (poll-only, listen off, listener down) empty polls stay at minPollMs", async () => {
    const h = harness({ random: fixed(1), wakeUps: false, steps: [0, 0, 0, 0, 1, 0, 0] });
    await runFor(1000, h.fetcher);
    expect(h.gaps().slice(0, 6)).toEqual([100, 100, 100, 100, 100, 100]);
  });

  it("losing wake-ups brings a backed-off poll interval straight back to minPollMs", async () => {
    const h = harness({ random: fixed(1) });
    h.fetcher.start();
    await vi.advanceTimersByTimeAsync(1500); // polls at 0, 200, 600, 1400: next one 800 ms later
    h.fetcher.setWakeUps(false);
    await vi.advanceTimersByTimeAsync(500);
    await h.fetcher.stop();
    expect(h.at.slice(0, 4)).toEqual([0, 200, 600, 1400]);
    expect(h.at.slice(4, 8)).toEqual([1600, 1700, 1800, 1900]);
  });
});

/** Let real event-loop turns pass (setImmediate is not faked): wake-ups run on them. */
async function turns(n: number) {
  for (let i = 0; i < n; i++) await new Promise((resolve) => setImmediate(resolve));
}

describe("Fetcher backoff (issue 41.5)", () => {
  it("while fetches fail, wake-ups fetch nothing: a burst of slotsFreed() and trigger() during the backoff adds no lease attempt", async () => {
    // A full batch (so freed slots would fetch), then two failures, then the database is back.
    const h = harness({
      random: fixed(1),
      backoffBaseMs: 100,
      backoffMaxMs: 400,
      minBatch: 10,
      batchSize: 10,
      steps: [10, boom(), boom(), 0],
    });
    h.fetcher.start();
    await turns(5);
    expect(h.at).toEqual([0, 0]);
    expect(h.fetcher.backlog).toBe(true);
    // What failing inbox checks did: every dispatch loop freed a slot, one event-loop turn after another.
    const burst = async () => {
      for (let i = 0; i < 50; i++) {
        h.fetcher.slotsFreed();
        h.fetcher.trigger();
        await turns(1);
      }
    };
    await burst();
    expect(h.at, "no fetch before the first backoff ran out").toEqual([0, 0]);
    await vi.advanceTimersByTimeAsync(100);
    await burst();
    expect(h.at, "the backoff timer fetched, and only it").toEqual([0, 0, 100]);
    await vi.advanceTimersByTimeAsync(200);
    expect(h.errors).toEqual([1, 2]);
    expect(h.at).toEqual([0, 0, 100, 300]);
    // Recovered: a wake-up fetches at once again.
    h.fetcher.trigger();
    await turns(5);
    expect(h.at).toEqual([0, 0, 100, 300, 300]);
    await h.fetcher.stop();
  });

  it("a listener that drops during the backoff (wake-ups lost) does not replace the backoff with a poll", async () => {
    // Empty polls back off to 800 ms; the fetch at 1400 fails: the next one is the backoff's, 300 ms on.
    const h = harness({ random: fixed(1), backoffBaseMs: 300, steps: [0, 0, 0, boom(), 0] });
    h.fetcher.start();
    await vi.advanceTimersByTimeAsync(1450);
    expect(h.at).toEqual([0, 200, 600, 1400]);
    h.fetcher.setWakeUps(false);
    await vi.advanceTimersByTimeAsync(550);
    await h.fetcher.stop();
    expect(h.at.slice(0, 5)).toEqual([0, 200, 600, 1400, 1700]);
  });

  it("gives up only when the run of failures also lasted the backoffs' shortest total (loopGiveUpMs) on its clock", async () => {
    // random 0: each backoff is its shortest (50, 100, 200 ms), so 3 failures take exactly 150 ms.
    const steps = [boom(), boom(), boom(), boom(), boom()];
    const onTime = harness({ random: fixed(0), maxConsecutiveFailures: 3, steps });
    await runFor(5000, onTime.fetcher);
    expect(onTime.errors).toEqual([1, 2, 3]);
    expect(onTime.fatal).toHaveLength(1);
    // A clock that shows half the time the timers took (a count reached faster than the backoffs allow):
    // 75 ms at the third failure, so it backs off once more and gives up at the fourth (175 ms).
    const slow = harness({ random: fixed(0), maxConsecutiveFailures: 3, steps, now: () => Date.now() / 2 });
    await runFor(5000, slow.fetcher);
    expect(slow.errors).toEqual([1, 2, 3, 4]);
    expect(slow.fatal).toHaveLength(1);
  });
});

describe("Fetcher batch size", () => {
  it("starts at minBatch, doubles while fetches come back full up to batchSize, and drops back after a short one", async () => {
    const h = harness({
      random: fixed(1),
      minBatch: 10,
      batchSize: 100,
      free: 1000,
      // Full, full, full, full (capped at 100), full, short, then a trickle.
      steps: [10, 20, 40, 80, 100, 100, 7, 0, 3],
    });
    await runFor(1000, h.fetcher);
    expect(h.limits.slice(0, 9)).toEqual([10, 20, 40, 80, 100, 100, 100, 10, 10]);
  });

  it("a short fetch whose store says more are waiting (a queue filled its share) fetches again at once, batch growing", async () => {
    const h = harness({
      random: fixed(1),
      minBatch: 10,
      batchSize: 100,
      free: 1000,
      steps: [{ rows: 4, more: true }, { rows: 12, more: true }, 5, 0],
    });
    await runFor(1000, h.fetcher);
    expect(h.limits.slice(0, 4), "short but more: the batch doubles as after a full one").toEqual([
      10, 20, 40, 10,
    ]);
    expect(h.gaps().slice(0, 3), "no poll wait until a fetch neither fills nor says more").toEqual([
      0, 0, 100,
    ]);
  });
});
