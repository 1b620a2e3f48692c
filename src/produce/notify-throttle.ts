/**
 * Decides which publishes also send a wake-up notification.
 *
 * Postgres serialises the commits of all transactions that queued a NOTIFY, so notifying on every publish
 * cuts producer throughput by two thirds. Instead, per queue: the first publish of a cooldown window
 * notifies inside its own transaction (an idle worker wakes at its commit); publishes during the window do
 * not, and one trailing notification at the end of the window covers them. Rows whose transaction commits
 * after the trailing notification are found by the worker's poll: a notification is a hint, never a count.
 */
export interface NotifyThrottleOptions {
  cooldownMs: number;
  /** Sends the trailing notification; absent when the publisher has no connection of its own. */
  trailing?: (queue: string) => void;
  now?: () => number;
  schedule?: (fn: () => void, ms: number) => void;
}

interface QueueWindow {
  openedAt: number;
  pending: boolean;
  timerSet: boolean;
}

export class NotifyThrottle {
  readonly #windows = new Map<string, QueueWindow>();
  readonly #cooldownMs: number;
  readonly #trailing: ((queue: string) => void) | undefined;
  readonly #now: () => number;
  readonly #schedule: (fn: () => void, ms: number) => void;

  constructor(options: NotifyThrottleOptions) {
    this.#cooldownMs = options.cooldownMs;
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
    if (!window || now - window.openedAt >= this.#cooldownMs) {
      this.#windows.set(queue, { openedAt: now, pending: false, timerSet: window?.timerSet ?? false });
      return true;
    }
    window.pending = true;
    if (this.#trailing && !window.timerSet) {
      window.timerSet = true;
      this.#schedule(() => this.#fireTrailing(queue), Math.max(0, window.openedAt + this.#cooldownMs - now));
    }
    return false;
  }

  #fireTrailing(queue: string): void {
    const window = this.#windows.get(queue);
    if (!window) return;
    window.timerSet = false;
    if (!window.pending) return;
    // The trailing notification opens a new window, so a steady stream of publishes costs one
    // notification per cooldown, not one per transaction.
    this.#windows.set(queue, { openedAt: this.#now(), pending: false, timerSet: false });
    this.#trailing?.(queue);
  }
}
