import type { Logger } from "pino";
import { type HeldRow, isLive } from "../lease/held.js";

export interface AloneRunsDeps {
  /** Whether a row held through a crash waits (LeaseStore.suspectsWaiting). */
  probe(): Promise<boolean>;
  /** How often a busy worker looks for such rows. */
  intervalMs: number;
  /** A fetch now (the worker may be idle). */
  wake(): void;
  log: Logger;
}

/**
 * When a worker leases alone. A row whose lease ran out was held by a delivery that ended without an
 * outcome, most often beside others in a batch whose worker crashed: which of them crashed it is unknown.
 * Each such row is leased alone, by a worker holding nothing else, which starts nothing else until its
 * outcome lands: a crash then charges that row alone (its `deliveries_count`), so a crash loop's culprit
 * reaches `maxDeliveries` while the rows it was held beside run once each and are never dead-lettered.
 *
 * Wanted at start (a crash may have left such rows), whenever the look every `intervalMs` finds one, and
 * until an alone lease finds none; meanwhile the worker leases nothing else and drains what it holds.
 */
export class AloneRuns {
  #wanted = true;
  #running: HeldRow | undefined;
  #timer: NodeJS.Timeout | undefined;
  #probing = false;

  constructor(private readonly deps: AloneRunsDeps) {}

  start(): void {
    this.#timer = setInterval(() => void this.#probe(), this.deps.intervalMs);
    this.#timer.unref();
  }

  stop(): void {
    clearInterval(this.#timer);
  }

  /** Rows to fetch now: none while an alone row is held; one, alone, once nothing is held; else `normal`. */
  free(held: number, normal: () => number): number {
    if (this.#running !== undefined && isLive(this.#running)) return 0;
    this.#running = undefined;
    if (!this.#wanted) return normal();
    return held === 0 ? 1 : 0;
  }

  /** Whether the next fetch leases alone (only ever asked once `free` allowed it). */
  get next(): boolean {
    return this.#wanted && this.#running === undefined;
  }

  /** What an alone lease took: its row, held alone until its outcome lands; or none (none waits now). */
  took(row: HeldRow | undefined): void {
    if (row === undefined) this.#wanted = false;
    else this.#running = row;
  }

  /** Such rows are known to wait (a repair made some): lease alone once what is held has drained. */
  want(): void {
    if (this.#wanted) return;
    this.#wanted = true;
    this.deps.wake();
  }

  async #probe(): Promise<void> {
    if (this.#wanted || this.#probing) return;
    this.#probing = true;
    try {
      if (await this.deps.probe()) this.want();
    } catch (error) {
      // The fetch loop reports a failing database; the next look tries again.
      this.deps.log.debug({ err: error }, "looking for messages held through a crash failed");
    } finally {
      this.#probing = false;
    }
  }
}
