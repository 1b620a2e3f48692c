import type { Logger } from "pino";
import { backoffDelay } from "../retry/strategies.js";

export interface RestartWatchDeps {
  /** When the server answering now started (`pg_postmaster_start_time()`), as text. */
  serverStarted(): Promise<string>;
  /** Take back the rows left under this process's own stale leases (see OwnLeases). */
  reclaim(): Promise<unknown>;
  /** How often to look at the server's start time while nothing failed. */
  everyMs: number;
  backoffBaseMs: number;
  backoffMaxMs: number;
  log: Logger;
  random?: () => number;
}

/**
 * Says when the database may have lost the worker's last writes, and has its stale leases taken back then:
 *
 * - once contact was lost (`lostContact`: a statement failed, an idle connection died, the listener
 *   reconnected), as soon as the server answers again. A crash, a restart and a failover all look like
 *   this, and a backend crash that reinitialises the server in place (`restart_after_crash`) loses writes
 *   without changing its start time;
 * - when the server's start time changed since the last look (every `everyMs`): a restart no connection
 *   of ours saw fail, as behind a pooler that reconnects to the server on its own.
 *
 * Taking back finds nothing when nothing was lost, so a doubt is settled by doing it.
 */
export class RestartWatch {
  #started: string | undefined;
  /** Bumped by every sign of lost contact; `#settled` is the value the last reclaim covered. */
  #doubt = 0;
  #settled = 0;
  #failures = 0;
  #timer: NodeJS.Timeout | undefined;
  #running: Promise<void> | undefined;
  #stopped = true;

  constructor(private readonly deps: RestartWatchDeps) {}

  /** Read the start time now (the baseline), then every `everyMs`. */
  start(): void {
    this.#stopped = false;
    this.#schedule(0);
  }

  lostContact(): void {
    this.#doubt++;
    // While failing, the backoff already schedules the next look; otherwise look now.
    if (this.#stopped || this.#running || this.#failures > 0) return;
    this.#schedule(0);
  }

  async stop(): Promise<void> {
    this.#stopped = true;
    clearTimeout(this.#timer);
    await this.#running;
  }

  #schedule(ms: number): void {
    clearTimeout(this.#timer);
    if (this.#stopped) return;
    this.#timer = setTimeout(() => {
      this.#running = this.#look().finally(() => {
        this.#running = undefined;
      });
    }, ms);
    this.#timer.unref();
  }

  async #look(): Promise<void> {
    const doubt = this.#doubt;
    let next: number;
    try {
      const started = await this.deps.serverStarted();
      const restarted = this.#started !== undefined && started !== this.#started;
      if (restarted) {
        this.deps.log.info(
          { startedAt: started },
          "the database server restarted: taking back rows its crash may have left under this worker's own leases",
        );
      }
      if (restarted || doubt > this.#settled) await this.deps.reclaim();
      // Only once taken back: a failed reclaim is tried again at the next look.
      this.#started = started;
      this.#settled = doubt;
      this.#failures = 0;
      // New doubt while this look ran: look again soon (not at once: a loop failing for another reason
      // keeps raising doubt while the server answers).
      next = this.#doubt > doubt ? this.deps.backoffBaseMs : this.deps.everyMs;
    } catch (error) {
      // No answer is itself lost contact: whatever the server did meanwhile is settled once it answers.
      this.#doubt++;
      this.#failures++;
      this.deps.log.debug(
        { err: error, consecutive: this.#failures },
        "restart watch could not reach the database",
      );
      next = backoffDelay(this.#failures, {
        baseMs: this.deps.backoffBaseMs,
        maxMs: this.deps.backoffMaxMs,
        random: this.deps.random,
      });
    }
    this.#schedule(next);
  }
}
