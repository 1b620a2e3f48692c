import type pg from "pg";
import type { Logger } from "pino";
import { runQuery } from "../sql/executor.js";
import { repairKeyHeadsStatement } from "../sql/key-heads.js";
import type { OutboxNames } from "../sql/names.js";

export interface KeyHeadRepairOptions {
  pool: () => pg.Pool;
  names: OutboxNames;
  /** The worker's ordered queues; none: nothing to repair. */
  queues: readonly string[];
  intervalMs: number;
  queryTimeoutMs: number;
  log: Logger;
}

/**
 * Once at start and then every `intervalMs`: a key whose head was deleted outside the worker (by hand, or
 * by a worker of an older version) would otherwise wait for good. Best effort: a failure is logged and
 * tried again next time; the fetch loop does not depend on it.
 */
export class KeyHeadRepair {
  #timer: NodeJS.Timeout | undefined;
  #running: Promise<void> | undefined;
  readonly #statement;

  constructor(private readonly options: KeyHeadRepairOptions) {
    this.#statement = repairKeyHeadsStatement(options.names);
  }

  start(): void {
    if (this.options.queues.length === 0) return;
    this.#running = this.runOnce();
    this.#timer = setInterval(() => {
      this.#running ??= this.runOnce().finally(() => {
        this.#running = undefined;
      });
    }, this.options.intervalMs);
    this.#timer.unref();
  }

  /** Promote the oldest row of every headless key → how many. */
  async runOnce(): Promise<void> {
    try {
      const rows = await runQuery(
        this.options.pool(),
        this.#statement,
        { queues: [...this.options.queues] },
        { timeoutMs: this.options.queryTimeoutMs },
      );
      if (rows.length > 0) {
        this.options.log.warn(
          { keys: rows.length, ids: rows.slice(0, 10).map((r) => r.id) },
          "keys without a head (deleted outside this worker: by hand, or by a worker of an older version): their oldest message is next",
        );
      }
    } catch (error) {
      this.options.log.warn({ err: error }, "key head repair failed; trying again later");
    } finally {
      this.#running = undefined;
    }
  }

  async stop(): Promise<void> {
    clearInterval(this.#timer);
    await this.#running;
  }
}
