/**
 * Decides which publishes also send a wake-up notification.
 *
 * Postgres serialises the commits of all transactions that queued a NOTIFY, so notifying on every publish
 * cuts producer throughput by two thirds. Instead, per queue: the first publish of a cooldown window
 * notifies inside its own transaction (an idle worker wakes at its commit); publishes during the window do
 * not, and one trailing notification at the end of the window covers them. Rows whose transaction commits
 * after the trailing notification are found by the worker's poll: a notification is a hint, never a count.
 *
 * With `maxCooldownMs` the window adapts per queue: a window that covered several publishes doubles the
 * next one (up to the max: dense producers notify less, and a busy worker hardly needs the hints), a window
 * that covered none halves it (down to `cooldownMs`: sparse publishes wake the worker at once).
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
  /** Publishes of this window that did not notify themselves. */
  covered: number;
  pending: boolean;
  timerSet: boolean;
}

/** Covered publishes in one window at which the next window doubles. */
const DENSE = 4;

export class NotifyThrottle {
  readonly #windows = new Map<string, QueueWindow>();
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
    const window = this.#windows.get(queue);
    if (!window || now - window.openedAt >= window.lengthMs) {
      this.#windows.set(queue, this.#next(window, now, window?.timerSet ?? false));
      return true;
    }
    window.pending = true;
    window.covered++;
    if (this.#trailing && !window.timerSet) {
      window.timerSet = true;
      this.#schedule(() => this.#fireTrailing(queue), Math.max(0, window.openedAt + window.lengthMs - now));
    }
    return false;
  }

  /** The window after `last`, its length adapted to how many publishes `last` covered. */
  #next(last: QueueWindow | undefined, now: number, timerSet: boolean): QueueWindow {
    let lengthMs = last?.lengthMs ?? this.#cooldownMs;
    if (last && last.covered >= DENSE) lengthMs = Math.min(this.#maxCooldownMs, lengthMs * 2);
    else if (last && last.covered === 0) lengthMs = Math.max(this.#cooldownMs, lengthMs / 2);
    return { openedAt: now, lengthMs, covered: 0, pending: false, timerSet };
  }

  #fireTrailing(queue: string): void {
    const window = this.#windows.get(queue);
    if (!window) return;
    window.timerSet = false;
    if (!window.pending) return;
    // The trailing notification opens a new window, so a steady stream of publishes costs one
    // notification per cooldown, not one per transaction.
    this.#windows.set(queue, this.#next(window, this.#now(), false));
    this.#trailing?.(queue);
  }
}
