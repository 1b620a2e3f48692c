import type pg from "pg";
import type { Logger } from "pino";
import { runQuery } from "../sql/executor.js";
import { guardExistsStatement, repairGuardsStatement } from "../sql/lease-guards.js";
import type { OutboxNames } from "../sql/names.js";

export interface GuardRepairOptions {
  pool: () => pg.Pool;
  names: OutboxNames;
  intervalMs: number;
  queryTimeoutMs: number;
  log: Logger;
}

/** Guards repaired per statement: a crash leaves one per batch in flight, a crash loop one per restart. */
const PER_STATEMENT = 100;

/**
 * The repair of transaction-held batches that ended without their outcomes (see repairGuardsStatement):
 * before the first fetch (a crash loop's restart counts the crash before the row is delivered again), and
 * then every `intervalMs` (another worker's crash). Best effort: a failure is logged and tried again later.
 */
export class GuardRepair {
  #timer: NodeJS.Timeout | undefined;
  #running: Promise<number> | undefined;
  readonly #statement;
  readonly #exists;

  constructor(private readonly options: GuardRepairOptions) {
    this.#statement = repairGuardsStatement(options.names);
    this.#exists = guardExistsStatement(options.names);
  }

  start(): void {
    this.#timer = setInterval(() => void this.runOnce(), this.options.intervalMs);
    this.#timer.unref();
  }

  /** Counts the deliveries of every ended guard → how many were counted. Never throws. */
  runOnce(): Promise<number> {
    this.#running ??= this.#repair().finally(() => {
      this.#running = undefined;
    });
    return this.#running;
  }

  /**
   * Repairs until the guard `id` is gone (its batch's deliveries counted), or `timeoutMs`: a batch of this
   * worker that failed to commit is counted before its rows can come back to it. The server may still be
   * rolling it back when its commit fails (its status in progress), so this is a wait, not one repair.
   */
  async after(id: string, timeoutMs: number): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    while (Date.now() < deadline) {
      await this.runOnce();
      try {
        const left = await runQuery(
          this.options.pool(),
          this.#exists,
          { id },
          { timeoutMs: this.options.queryTimeoutMs },
        );
        if (left.length === 0) return;
      } catch {
        return;
      }
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
  }

  async #repair(): Promise<number> {
    let counted = 0;
    try {
      for (;;) {
        const [row] = await runQuery(
          this.options.pool(),
          this.#statement,
          { limit: PER_STATEMENT },
          { timeoutMs: this.options.queryTimeoutMs },
        );
        counted += row?.counted ?? 0;
        if ((row?.cleared ?? 0) < PER_STATEMENT) break;
      }
      if (counted > 0) {
        this.options.log.warn(
          { counted },
          "transaction-held batches ended without their outcomes (a crash or a lost connection): their deliveries are counted, and the messages delivered again",
        );
      }
    } catch (error) {
      this.options.log.warn({ err: error }, "lease guard repair failed; trying again later");
    }
    return counted;
  }

  async stop(): Promise<void> {
    clearInterval(this.#timer);
    await this.#running;
  }
}
