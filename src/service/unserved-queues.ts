import pino, { type Logger } from "pino";
import { type Executor, runQuery } from "../sql/executor.js";
import { type StaleQueueRow, staleQueuesStatement } from "../sql/inspect.js";
import { outboxNames } from "../sql/names.js";

/** Options of {@link createUnservedQueueWatch}. */
export interface UnservedQueueWatchOptions {
  /** Where the check runs: one short statement per interval. */
  pool: Executor;
  schema: string;
  /** A queue is unserved when its oldest ready message has waited this long and no lease touches it. */
  warnAfterMs: number;
  /** Time between checks. */
  intervalMs: number;
  /** The queues this service serves: named in the warning, which then points at this service. */
  servedHere: ReadonlySet<string>;
  /** Bound on each round trip (pg's query_timeout). */
  queryTimeoutMs?: number;
  logger?: Logger;
}

/** Warns once per queue whose messages wait with no worker taking them (see README "Unserved queues"). */
export interface UnservedQueueWatch {
  /** Check every interval from now on. The timer does not hold the process open. */
  start(): void;
  /** One check now; waits for one under way first. Never throws (a failure is a warning). */
  check(): Promise<void>;
  /** No more checks; waits for a running one. */
  stop(): Promise<void>;
}

/**
 * The rule, from the database alone, so it holds with any number of services serving different queues:
 * a queue is unserved when its oldest ready message has waited `warnAfterMs` and no row of it is under a
 * live lease, at two checks in a row (a worker between two batches holds no lease for a moment; at two
 * checks an interval apart it would be leasing at one of them). One warning per queue, with the age;
 * once its messages are taken again (or gone), one info line, and the next time it is unserved, a new
 * warning. Every replica checks on its own, so each says it once.
 */
export function createUnservedQueueWatch(opts: UnservedQueueWatchOptions): UnservedQueueWatch {
  const statement = staleQueuesStatement(outboxNames(opts.schema));
  const log = (opts.logger ?? pino({ name: "outbox-unserved-queues" })).child({ schema: opts.schema });
  /** Unleased with an old ready message at the last check. */
  let suspects = new Set<string>();
  /** Warned about, and not recovered since. */
  const warned = new Set<string>();
  let failing = false;
  let running: Promise<void> | undefined;
  let timer: NodeJS.Timeout | undefined;
  let active = false;

  async function run(): Promise<void> {
    let rows: StaleQueueRow[];
    try {
      rows = await runQuery(
        opts.pool,
        statement,
        { olderThanMs: opts.warnAfterMs },
        { timeoutMs: opts.queryTimeoutMs },
      );
    } catch (error) {
      // One line per outage, not one per interval: the worker's own loops report the database's state.
      if (!failing) log.warn({ err: error }, "unserved-queue check failed; trying again every interval");
      failing = true;
      return;
    }
    failing = false;
    const unleased = new Map(rows.filter((r) => !r.leased).map((r) => [r.queue, r.oldest_ready_age_s]));
    for (const [queue, ageS] of unleased) {
      if (warned.has(queue) || !suspects.has(queue)) continue;
      warned.add(queue);
      const fields = { queue, oldestReadyAgeS: Math.round(ageS), warnAfterMs: opts.warnAfterMs };
      if (opts.servedHere.has(queue)) {
        log.warn(
          { ...fields, servedHere: true },
          "messages of a queue this service serves wait and no worker holds a lease on it: its fetches are not getting through (see the worker's loop errors)",
        );
      } else {
        log.warn(
          { ...fields, servedHere: false },
          "messages wait on a queue no worker takes from: no running service serves it (its service is down, or no handler or relay is named for this queue)",
        );
      }
    }
    for (const queue of warned) {
      if (unleased.has(queue)) continue;
      warned.delete(queue);
      log.info({ queue }, "messages of a queue reported unserved are taken again, or gone");
    }
    suspects = new Set(unleased.keys());
  }

  function check(): Promise<void> {
    const next = (running ?? Promise.resolve()).then(run);
    const current = next.finally(() => {
      if (running === current) running = undefined;
    });
    running = current;
    return current;
  }

  function schedule(): void {
    if (!active) return;
    timer = setTimeout(() => {
      void check().finally(schedule);
    }, opts.intervalMs);
    timer.unref();
  }

  return {
    start() {
      if (active) return;
      active = true;
      schedule();
    },
    check,
    async stop() {
      active = false;
      clearTimeout(timer);
      await running;
    },
  };
}
