/**
 * Notices when the event loop was blocked (a synchronous, CPU-bound handler; a huge JSON.parse): nothing
 * else runs meanwhile, the heartbeat included, so every lease the worker holds goes unrenewed and can run
 * out. A timer that fires late by `thresholdMs` or more reports how late it was.
 */
export class EventLoopWatch {
  readonly #tickMs: number;
  readonly #thresholdMs: number;
  readonly #onBlocked: (blockedMs: number) => void;
  readonly #now: () => number;
  #timer: NodeJS.Timeout | undefined;
  #last = 0;

  constructor(deps: {
    tickMs: number;
    thresholdMs: number;
    onBlocked: (blockedMs: number) => void;
    now?: () => number;
  }) {
    this.#tickMs = deps.tickMs;
    this.#thresholdMs = deps.thresholdMs;
    this.#onBlocked = deps.onBlocked;
    this.#now = deps.now ?? (() => performance.now());
  }

  start(): void {
    if (this.#timer) return;
    this.#last = this.#now();
    this.#timer = setInterval(() => this.tick(), this.#tickMs);
    // Never what keeps the process alive.
    this.#timer.unref();
  }

  stop(): void {
    clearInterval(this.#timer);
    this.#timer = undefined;
  }

  /** One timer tick (public for tests with an injected clock). */
  tick(): void {
    const now = this.#now();
    const late = now - this.#last - this.#tickMs;
    this.#last = now;
    if (late >= this.#thresholdMs) this.#onBlocked(Math.round(late + this.#tickMs));
  }
}
