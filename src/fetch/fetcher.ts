/**
 * The fetch loop: leases rows into the local queue. Every wake-up source calls `trigger()`: a
 * notification, the poll timer, freed local-queue slots, the listener reconnecting.
 *
 *   state      trigger()                                 fetch ends
 *   idle       run now (debounced to one run per tick)   -
 *   fetching   remember it: fetch again right after       full batch → batch doubles (up to batchSize),
 *                                                         fetch again while slots are free;
 *                                                         some rows → batch back to minBatch, poll again
 *                                                         at the min interval;
 *                                                         none → poll interval doubles (jittered) up to the
 *                                                         max while wake-ups work, stays at the min while
 *                                                         they do not (poll-only);
 *                                                         error → back off, fatal after N in a row
 *   stopped    ignored                                   -
 *
 * No fetch asks for more rows than the local queue has free slots, so memory never grows with the backlog.
 * The batch starts small, so a trickle of messages is spread over workers and leased with a small LIMIT,
 * and grows while fetches come back full, so a backlog drains at the tuned size.
 */
import { backoffDelay } from "../retry/strategies.js";

export interface FetcherDeps<Row> {
  /** Lease up to `limit` rows; `more`: more are probably waiting even if fewer than `limit` came. */
  lease(limit: number): Promise<{ rows: Row[]; more?: boolean }>;
  /** Free local slots right now. */
  free(): number;
  deliver(rows: Row[]): void;
  /** The most rows one fetch leases. */
  batchSize: number;
  /** The first fetch after a short one asks for this many (default: batchSize). */
  minBatch?: number;
  minPollMs: number;
  maxPollMs: number;
  backoffBaseMs: number;
  backoffMaxMs: number;
  maxConsecutiveFailures: number;
  onError(error: Error, consecutive: number): void;
  onFatal(error: Error): void;
  random?: () => number;
}

type State = "idle" | "fetching" | "stopped";

export class Fetcher<Row> {
  #state: State = "idle";
  #again = false;
  #scheduled = false;
  #timer: NodeJS.Timeout | undefined;
  #pollMs: number;
  #failures = 0;
  /** The last fetch filled its batch: more rows are probably waiting, so freed slots should fetch. */
  #backlog = false;
  #running: Promise<void> = Promise.resolve();
  readonly #random: () => number;
  readonly #minBatch: number;
  #batch: number;
  /** Wake-ups arrive (LISTEN works): empty polls may back off to maxPollMs. Off: polling is all there is. */
  #wakeUps = false;

  constructor(private readonly deps: FetcherDeps<Row>) {
    this.#pollMs = deps.minPollMs;
    this.#random = deps.random ?? Math.random;
    this.#minBatch = Math.max(1, Math.min(deps.minBatch ?? deps.batchSize, deps.batchSize));
    this.#batch = this.#minBatch;
  }

  /** The batch the next fetch asks for (before the free-slot bound). */
  get batch(): number {
    return this.#batch;
  }

  /**
   * Whether notifications wake the worker. Without them (poll-only behind a transaction pooler, listener
   * down or off) an empty poll must not back off towards maxPollMs: that would be the pickup latency of
   * the first message after a quiet spell.
   */
  setWakeUps(on: boolean): void {
    if (this.#wakeUps === on) return;
    this.#wakeUps = on;
    if (!on && this.#pollMs > this.deps.minPollMs) {
      this.#pollMs = this.deps.minPollMs;
      if (this.#state === "idle") this.#schedule(this.#pollMs);
    }
  }

  get backlog(): boolean {
    return this.#backlog;
  }

  start(): void {
    this.trigger();
  }

  trigger(): void {
    if (this.#state === "stopped") return;
    if (this.#state === "fetching") {
      this.#again = true;
      return;
    }
    if (this.#scheduled) return;
    this.#scheduled = true;
    // One run per tick however many wake-ups arrive together (a burst of notifications, say).
    setImmediate(() => {
      this.#scheduled = false;
      this.#running = this.#run();
    });
  }

  /** A wake-up meant only for a backlog: freed slots after a full batch. */
  slotsFreed(): void {
    if (this.#backlog) this.trigger();
  }

  /** Stop leasing; resolves when an in-flight fetch has delivered its rows. */
  async stop(): Promise<void> {
    this.#state = "stopped";
    clearTimeout(this.#timer);
    await this.#running;
  }

  async #run(): Promise<void> {
    if (this.#state !== "idle") return;
    clearTimeout(this.#timer);
    this.#state = "fetching";
    let next: number | undefined = this.#pollMs;
    try {
      for (;;) {
        this.#again = false;
        const limit = Math.min(this.#batch, this.deps.free());
        if (limit <= 0) {
          // Queue full: the next freed slot triggers us; the poll timer is only a safety net.
          this.#backlog = true;
          next = this.deps.maxPollMs;
          break;
        }
        let rows: Row[];
        let more: boolean | undefined;
        try {
          ({ rows, more } = await this.deps.lease(limit));
        } catch (error) {
          next = this.#failed(error as Error);
          break;
        }
        this.#failures = 0;
        if (rows.length > 0) this.deps.deliver(rows);
        if (this.#stoppedNow()) return;
        this.#backlog = rows.length === limit || more === true;
        // Full: more are waiting, so ask for more next time; short: the backlog is gone, start small again.
        if (this.#backlog && limit === this.#batch)
          this.#batch = Math.min(this.deps.batchSize, this.#batch * 2);
        else if (!this.#backlog) this.#batch = this.#minBatch;
        if (rows.length > 0) {
          this.#pollMs = this.deps.minPollMs;
        } else if (!this.#again && this.#wakeUps) {
          this.#pollMs = Math.min(this.deps.maxPollMs, this.#pollMs * 2);
        }
        if (this.#backlog || this.#again) continue;
        next = this.#pollMs;
        break;
      }
    } finally {
      if (this.#state === "fetching") this.#state = "idle";
    }
    if (this.#state === "idle" && next !== undefined) this.#schedule(next);
  }

  /** Re-read after an await: stop() may have run meanwhile. */
  #stoppedNow(): boolean {
    return this.#state === "stopped";
  }

  #failed(error: Error): number | undefined {
    this.#failures++;
    this.deps.onError(error, this.#failures);
    if (this.#failures >= this.deps.maxConsecutiveFailures) {
      this.#state = "stopped";
      this.deps.onFatal(error);
      return undefined;
    }
    return backoffDelay(this.#failures, {
      baseMs: this.deps.backoffBaseMs,
      maxMs: this.deps.backoffMaxMs,
      random: this.#random,
    });
  }

  #schedule(ms: number): void {
    clearTimeout(this.#timer);
    // Up to 20 % early, never late, so that workers started together do not poll in lockstep and the
    // interval stays a bound on how long a row waits for the next poll.
    const jittered = Math.max(1, Math.round(ms * (0.8 + 0.2 * this.#random())));
    // Not unref'd: a running worker keeps its process alive even when it has nothing else open.
    this.#timer = setTimeout(() => this.trigger(), jittered);
  }
}
