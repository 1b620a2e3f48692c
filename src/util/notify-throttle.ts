/**
 * Decides which publishes also send a wake-up notification.
 *
 * Postgres serialises the commits of all transactions that queued a NOTIFY, so notifying on every publish
 * cuts producer throughput by two thirds. Instead, per queue: the first publish of a cooldown window
 * notifies inside its own transaction (an idle worker wakes at its commit); publishes during the window do
 * not, and one trailing notification at the end of the window covers them. Rows whose transaction commits
 * after the trailing notification are found by the worker's poll: a notification is a hint, never a count.
 *
 * With `maxCooldownMs` the window adapts per queue to the publish rate, smoothed over recent publishes:
 * up to 1,000 a second (one per ms with the default 2 ms) every window is the shortest, so a steady trickle
 * waits at most that long for its wake-up; above it the window grows with the square of the rate, up to the
 * max at 2,000 a second, where producers notify as rarely as before. A rate, not one window's count:
 * counting each window's publishes let a single burst double it, and a window only shrank after one with no
 * publish at all, so any steady rate above one per window stayed at the max (a 4 ms pickup at 500 msg/s).
 */
export interface NotifyThrottleOptions {
  /** The window, or its shortest length when it adapts. */
  cooldownMs: number;
  /** The longest window; unset or equal to cooldownMs: a fixed window. */
  maxCooldownMs?: number;
  /** Sends the trailing notification; absent when the publisher has no connection of its own. */
  trailing?: (queue: string) => void;
  now?: () => number;
  schedule?: (fn: () => void, ms: number) => void;
}

interface QueueWindow {
  openedAt: number;
  lengthMs: number;
  pending: boolean;
  timerSet: boolean;
}

/** The publish gap per queue, smoothed: what an adaptive window's length follows. */
interface QueueRate {
  lastAt: number;
  /** Moving average of the time between publishes (ms); undefined until a second publish. */
  gapMs: number | undefined;
}

/** Weight of each new gap in the moving average: about the last 16 publishes count. */
const GAP_WEIGHT = 1 / 16;
/**
 * Publishes per shortest window above which the window grows: 2 in 2 ms, i.e. 1,000 a second. Below it the
 * shortest window's notifications cost producers little (measured: bench/RESULTS.md, issue 30).
 */
const GROW_AT = 2;

export class NotifyThrottle {
  readonly #windows = new Map<string, QueueWindow>();
  readonly #rates = new Map<string, QueueRate>();
  readonly #cooldownMs: number;
  readonly #maxCooldownMs: number;
  readonly #trailing: ((queue: string) => void) | undefined;
  readonly #now: () => number;
  readonly #schedule: (fn: () => void, ms: number) => void;

  constructor(options: NotifyThrottleOptions) {
    this.#cooldownMs = options.cooldownMs;
    this.#maxCooldownMs = Math.max(options.cooldownMs, options.maxCooldownMs ?? options.cooldownMs);
    this.#trailing = options.trailing;
    this.#now = options.now ?? (() => performance.now());
    this.#schedule =
      options.schedule ??
      ((fn, ms) => {
        // Unref'd: a pending wake-up hint must not keep a finished process alive.
        setTimeout(fn, ms).unref();
      });
  }

  /** True when this publish should notify inside its transaction. */
  claim(queue: string): boolean {
    const now = this.#now();
    this.#observe(queue, now);
    const window = this.#windows.get(queue);
    if (!window || now - window.openedAt >= window.lengthMs) {
      this.#windows.set(queue, this.#open(queue, now, window?.timerSet ?? false));
      return true;
    }
    window.pending = true;
    if (this.#trailing && !window.timerSet) {
      window.timerSet = true;
      this.#schedule(() => this.#fireTrailing(queue), Math.max(0, window.openedAt + window.lengthMs - now));
    }
    return false;
  }

  /** Learn the queue's publish rate from the gap since its last publish. */
  #observe(queue: string, now: number): void {
    const rate = this.#rates.get(queue);
    if (!rate) {
      this.#rates.set(queue, { lastAt: now, gapMs: undefined });
      return;
    }
    // A quiet spell counts as no more than a sparse gap, so the first burst after it is seen within a
    // few publishes instead of after hundreds.
    const gap = Math.min(now - rate.lastAt, 2 * this.#maxCooldownMs);
    rate.gapMs = rate.gapMs === undefined ? gap : rate.gapMs + (gap - rate.gapMs) * GAP_WEIGHT;
    rate.lastAt = now;
  }

  /** A window opening now, as long as the queue's recent publish rate asks for. */
  #open(queue: string, now: number, timerSet: boolean): QueueWindow {
    const gapMs = this.#rates.get(queue)?.gapMs;
    let lengthMs = this.#cooldownMs;
    if (gapMs !== undefined && this.#maxCooldownMs > this.#cooldownMs) {
      const perShortest = this.#cooldownMs / Math.max(gapMs, 1e-3);
      // With the square of the rate: at twice GROW_AT the window is 4× the shortest (the default max), so
      // from 2,000 a second producers notify no more often than before the window followed the rate.
      const grown = this.#cooldownMs * (perShortest / GROW_AT) ** 2;
      lengthMs = Math.min(this.#maxCooldownMs, Math.max(this.#cooldownMs, grown));
    }
    return { openedAt: now, lengthMs, pending: false, timerSet };
  }

  #fireTrailing(queue: string): void {
    const window = this.#windows.get(queue);
    if (!window) return;
    window.timerSet = false;
    if (!window.pending) return;
    // The trailing notification opens a new window, so a steady stream of publishes costs one
    // notification per cooldown, not one per transaction.
    this.#windows.set(queue, this.#open(queue, this.#now(), false));
    this.#trailing?.(queue);
  }
}
