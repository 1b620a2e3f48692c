import { OutboxConfigError } from "../contract/errors.js";

/**
 * The time a handler test runs on. The harness reads it for the message's times, the handler's duration and
 * its timeout; a {@link ManualClock} lets a test time a hanging handler out by advancing it, without waiting.
 */
export interface Clock {
  /** Milliseconds since the epoch. */
  now(): number;
  /** Calls `fn` once `ms` have passed on this clock; returns a function that cancels it. */
  setTimeout(fn: () => void, ms: number): () => void;
}

/** A {@link Clock} that moves only when the test calls {@link ManualClock.advance}. */
export interface ManualClock extends Clock {
  /** Moves the clock forward by `ms`, firing every timer that falls due, in due order, synchronously. */
  advance(ms: number): void;
}

/** The real clock: `Date.now()` and `setTimeout`, as the worker runs. */
export const systemClock: Clock = {
  now: () => Date.now(),
  setTimeout(fn, ms) {
    const timer = setTimeout(fn, ms);
    return () => clearTimeout(timer);
  },
};

interface Timer {
  at: number;
  seq: number;
  fn: () => void;
}

/** A {@link ManualClock} starting at `start` (default 2026-01-01T00:00:00Z). */
export function createManualClock(start: Date | number = Date.UTC(2026, 0, 1)): ManualClock {
  let now = typeof start === "number" ? start : start.getTime();
  let seq = 0;
  const timers = new Set<Timer>();
  return {
    now: () => now,
    setTimeout(fn, ms) {
      const timer = { at: now + Math.max(0, ms), seq: seq++, fn };
      timers.add(timer);
      return () => void timers.delete(timer);
    },
    advance(ms) {
      if (!(ms >= 0)) throw new OutboxConfigError("ms", ">= 0", `advance takes ms >= 0, got ${String(ms)}`);
      const target = now + ms;
      for (;;) {
        // Earliest first, then in the order they were set; a timer set by a firing one is seen too.
        let next: Timer | undefined;
        for (const t of timers) {
          if (t.at <= target && (!next || t.at < next.at || (t.at === next.at && t.seq < next.seq))) next = t;
        }
        if (!next) break;
        timers.delete(next);
        now = next.at;
        next.fn();
      }
      now = target;
    },
  };
}
