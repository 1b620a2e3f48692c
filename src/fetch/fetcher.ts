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
 *                                                         error → back off (failing), fatal after N in a
 *                                                         row lasting loopGiveUpMs
 *   failing    ignored (the backoff timer fetches)       -
 *   stopped    ignored                                   -
 *
 * While fetches fail in a row, the backoff timer alone fetches: freed slots, notifications and reconnects
 * wake nothing, so a burst of them (failing inbox checks free the local queue's slots in a burst) cannot
 * spend the run of failures that makes the worker give up. And it gives up only after the run has also
 * lasted the backoffs' shortest total (loopGiveUpMs): a brief outage never ends a worker.
 *
 * No fetch asks for more rows than the local queue has free slots, so memory never grows with the backlog.
 * The batch starts small, so a trickle of messages is spread over workers and leased with a small LIMIT,
 * and grows while fetches come back full, so a backlog drains at the tuned size.
 */
import { backoffDelay, loopGiveUpMs } from "../retry/strategies.js";

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
  /** A monotonic clock in ms (default performance.now), for tests. */
  now?: () => number;
}

type State = "idle" | "fetching" | "stopped";

export class Fetcher<Row> {
  #state: State = "idle";
  #again = false;
  #scheduled = false;
  #timer: NodeJS.Timeout | undefined;
  #pollMs: number;
  /** Failed fetches in a row; while > 0 only the backoff timer fetches. */
  #failures = 0;
  /** When the run of failures began (the first of them). */
  #failingSince = 0;
  readonly #giveUpMs: number;
  readonly #now: () => number;
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
    this.#now = deps.now ?? (() => performance.now());
    this.#giveUpMs = loopGiveUpMs(deps.maxConsecutiveFailures, {
      baseMs: deps.backoffBaseMs,
      maxMs: deps.backoffMaxMs,
    });
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
      // Not while backing off: the listener drops in the same outage, and replacing the backoff timer
      // with a poll would fetch again at once.
      if (this.#state === "idle" && this.#failures === 0) this.#schedule(this.#pollMs);
    }
  }

  get backlog(): boolean {
    return this.#backlog;
  }

  start(): void {
    this.trigger();
  }

  /** Look for rows now, unless fetches are failing: then the backoff timer's fetch is the next one. */
  trigger(): void {
    this.#wake(false);
  }

  #wake(byTimer: boolean): void {
    if (this.#state === "stopped") return;
    if (this.#state === "fetching") {
      // A fetch that fails ignores this (it backs off); one that succeeds fetches again.
      this.#again = true;
      return;
    }
    // Backing off: a wake-up (freed slots, a notification, a reconnect) must not fetch now, or a burst of
    // them spends the run of failures in milliseconds. The backoff timer fetches when it fires.
    if (this.#failures > 0 && !byTimer) return;
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
    let backoff = false;
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
          backoff = true;
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
    // The backoff is jittered already (and its shortest total is what loopGiveUpMs counts): no poll jitter.
    if (this.#state === "idle" && next !== undefined) this.#schedule(next, !backoff);
  }

  /** Re-read after an await: stop() may have run meanwhile. */
  #stoppedNow(): boolean {
    return this.#state === "stopped";
  }

  #failed(error: Error): number | undefined {
    const now = this.#now();
    this.#failures++;
    if (this.#failures === 1) this.#failingSince = now;
    this.deps.onError(error, this.#failures);
    // Both a run of N and the time N backoffs take at the least: a count alone could be spent in a burst
    // (as it was by wake-ups that bypassed the backoff), and a sub-second outage then ended the worker.
    if (this.#failures >= this.deps.maxConsecutiveFailures && now - this.#failingSince >= this.#giveUpMs) {
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

  #schedule(ms: number, jitter = true): void {
    clearTimeout(this.#timer);
    // Up to 20 % early, never late, so that workers started together do not poll in lockstep and the
    // interval stays a bound on how long a row waits for the next poll.
    const delay = Math.max(1, jitter ? Math.round(ms * (0.8 + 0.2 * this.#random())) : Math.ceil(ms));
    // Not unref'd: a running worker keeps its process alive even when it has nothing else open.
    this.#timer = setTimeout(() => this.#wake(true), delay);
  }
}
