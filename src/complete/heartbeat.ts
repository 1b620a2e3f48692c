/**
 * Renews the lease of every row this worker holds (queued locally, in a handler, or waiting for its
 * completion write) in one token-guarded statement per beat, so a handler that outlives the lease TTL is
 * not handed to a second worker while this one is alive. A row the renewal no longer finds was taken over:
 * the caller aborts its handler and forgets it.
 */
import { type HeldRow, isLive } from "../lease/held.js";
import type { Landed, LeaseStore } from "../lease/store.js";

export interface HeartbeatDeps {
  intervalMs: number;
  /** How long after a renewal was sent its rows count as confirmed ours (lease TTL less a margin). */
  confirmedForMs: number;
  collect(): HeldRow[];
  store: Pick<LeaseStore, "renew">;
  lost(held: HeldRow): void;
  onError(error: Error, consecutive: number): void;
  onRecovered(): void;
}

export class Heartbeat {
  #timer: NodeJS.Timeout | undefined;
  #failures = 0;
  #stopped = false;
  #beating: Promise<void> = Promise.resolve();
  /** A renewal asked for now (a stale row waits to start): shared by every caller while in flight. */
  #asked: Promise<void> | undefined;

  constructor(private readonly deps: HeartbeatDeps) {}

  start(): void {
    this.#schedule();
  }

  async stop(): Promise<void> {
    this.#stopped = true;
    clearTimeout(this.#timer);
    await this.#beating;
  }

  #schedule(): void {
    if (this.#stopped) return;
    this.#timer = setTimeout(() => {
      this.#beating = this.beat().finally(() => this.#schedule());
    }, this.deps.intervalMs);
  }

  /** A renewal now, shared with any other caller asking while it is in flight. */
  beatNow(): Promise<void> {
    this.#asked ??= this.beat().finally(() => {
      this.#asked = undefined;
    });
    return this.#asked;
  }

  /** One renewal now (also used by tests). */
  async beat(): Promise<void> {
    const rows = this.deps.collect();
    if (rows.length === 0) return;
    // Sent now: the server's new expiry is at least this plus the TTL, whenever the answer comes back.
    const sent = performance.now();
    let kept: Landed;
    try {
      kept = await this.deps.store.renew(rows);
    } catch (error) {
      this.#failures++;
      this.deps.onError(error as Error, this.#failures);
      return;
    }
    if (this.#failures > 0) this.deps.onRecovered();
    this.#failures = 0;
    for (const held of rows) {
      // A row whose completion write started meanwhile may be gone because of that write, not a takeover.
      if (kept.has(held)) {
        held.validUntil = sent + this.deps.confirmedForMs;
        continue;
      }
      if (held.writing || !isLive(held)) continue;
      this.deps.lost(held);
    }
  }
}
