import type pg from "pg";
import type { Logger } from "pino";
import { plainArray, runQuery } from "../sql/executor.js";
import { guardsLeftStatement, repairGuardsStatement } from "../sql/lease-guards.js";
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
  readonly #left;

  constructor(private readonly options: GuardRepairOptions) {
    this.#statement = repairGuardsStatement(options.names);
    this.#left = guardsLeftStatement(options.names);
  }

  start(): void {
    this.#timer = setInterval(() => void this.runOnce(), this.options.intervalMs);
    this.#timer.unref();
  }

  /** Counts the deliveries of every ended guard → how many were counted. Never throws (logged). */
  runOnce(): Promise<number> {
    return this.repairNow().catch((error: unknown) => {
      this.options.log.warn({ err: error }, "lease guard repair failed; trying again later");
      return 0;
    });
  }

  /** `runOnce` that throws when the database does (one repair at a time, shared by concurrent callers). */
  repairNow(): Promise<number> {
    this.#running ??= this.#repair().finally(() => {
      this.#running = undefined;
    });
    return this.#running;
  }

  /** Which of the guards `ids` are still there (not yet repaired). Throws when the database does. */
  async left(ids: readonly string[]): Promise<Set<string>> {
    const rows = await runQuery(
      this.options.pool(),
      this.#left,
      { ids: plainArray(ids) },
      { timeoutMs: this.options.queryTimeoutMs },
    );
    return new Set(rows.map((r) => r.id));
  }

  async #repair(): Promise<number> {
    let counted = 0;
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
    return counted;
  }

  async stop(): Promise<void> {
    clearInterval(this.#timer);
    await this.#running;
  }
}
