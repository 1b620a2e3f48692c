import pino, { type Logger } from "pino";
import {
  type ExpireCountRow,
  expireDeadLettersStatement,
  oldestDeadLetterStatement,
} from "../sql/dead-letters.js";
import { type Executor, runQuery } from "../sql/executor.js";
import { outboxNames } from "../sql/names.js";

/** Options of {@link createDeadLetterRetention}. */
export interface DeadLetterRetentionOptions {
  /** Where the deletes run: the service's pool (each batch takes one connection, briefly). */
  pool: Executor;
  schema: string;
  /** Dead letters that died longer ago than this are deleted. */
  retentionMs: number;
  /** Time between runs (plus jitter); default 60 s. */
  intervalMs?: number;
  /** Up to this much is added to each wait, at random, so replicas started together spread out; default a fifth of intervalMs. */
  jitterMs?: number;
  /** Most rows one statement deletes; default 500. */
  batchSize?: number;
  /** Pause between two batches of a run, so a large backlog never keeps a connection busy; default 100 ms. */
  pauseMs?: number;
  /** Bound on each round trip (pg's query_timeout). */
  queryTimeoutMs?: number;
  logger?: Logger;
  /** Source of randomness for the jitter, [0, 1); tests pass a fixed one. */
  random?: () => number;
}

/** What one run deleted. */
export interface DeadLetterRetentionRun {
  /** Rows deleted, all queues. */
  deleted: number;
  /** Rows deleted per queue (only queues that lost rows). */
  byQueue: Record<string, number>;
  /** Statements run, the last one included (it deleted fewer than a batch, maybe none). */
  batches: number;
  /** The run failed part way: what was deleted before the failure is counted above. */
  error?: unknown;
}

/** Listener of {@link DeadLetterRetention.onExpired}: rows of one queue a batch deleted. */
export type ExpiredListener = (event: { queue: string; count: number }) => void;

/** The dead-letter retention job: deletes expired dead letters in small batches, every interval. */
export interface DeadLetterRetention {
  /** Run every interval (plus jitter) from now on. The timer does not hold the process open. */
  start(): void;
  /** One run now, batch after batch until none is full; waits for a run already under way first. Never throws. */
  runOnce(): Promise<DeadLetterRetentionRun>;
  /** Called for every batch that deleted rows (the metrics counter); returns the unsubscribe function. */
  onExpired(listener: ExpiredListener): () => void;
  /** No more runs; a running one stops after its current batch, and this waits for it. */
  stop(): Promise<void>;
}

const DEFAULT_INTERVAL_MS = 60_000;
const DEFAULT_BATCH_SIZE = 500;
const DEFAULT_PAUSE_MS = 100;

/**
 * Deletes dead letters older than the retention. Each batch is one short statement (its own transaction)
 * on at most `batchSize` rows picked through the dead_at index with SKIP LOCKED, so it never waits on a
 * replay, a purge or another replica doing the same, and never holds locks for long; batches are spaced
 * by `pauseMs` so the worker always gets its connections. A failure is a warning, and the next run tries
 * again.
 */
export function createDeadLetterRetention(opts: DeadLetterRetentionOptions): DeadLetterRetention {
  const names = outboxNames(opts.schema);
  const expire = expireDeadLettersStatement(names);
  const oldest = oldestDeadLetterStatement(names);
  const intervalMs = opts.intervalMs ?? DEFAULT_INTERVAL_MS;
  const jitterMs = opts.jitterMs ?? intervalMs / 5;
  const batchSize = opts.batchSize ?? DEFAULT_BATCH_SIZE;
  const pauseMs = opts.pauseMs ?? DEFAULT_PAUSE_MS;
  const random = opts.random ?? Math.random;
  const log = (opts.logger ?? pino({ name: "outbox-retention" })).child({
    schema: opts.schema,
    job: "dead-letter-retention",
  });
  const runOptions = { timeoutMs: opts.queryTimeoutMs };
  const listeners = new Set<ExpiredListener>();

  let started = false;
  let stopped = false;
  let timer: NodeJS.Timeout | undefined;
  let running: Promise<DeadLetterRetentionRun> | undefined;
  // The last run was refused for want of a right (said once, until a run works again).
  let refusedBefore = false;
  // Wakes a run out of its pause between batches when stop() is called.
  let wakePause: (() => void) | undefined;

  function pause(): Promise<void> {
    return new Promise((resolve) => {
      const t = setTimeout(done, pauseMs);
      function done() {
        clearTimeout(t);
        wakePause = undefined;
        resolve();
      }
      wakePause = done;
    });
  }

  function emit(rows: ExpireCountRow[]) {
    for (const row of rows) {
      for (const listener of listeners) {
        try {
          listener({ queue: row.queue, count: row.deleted });
        } catch (error) {
          log.warn({ err: error }, "dead-letter retention listener failed");
        }
      }
    }
  }

  async function work(): Promise<DeadLetterRetentionRun> {
    const result: DeadLetterRetentionRun = { deleted: 0, byQueue: {}, batches: 0 };
    const started = Date.now();
    try {
      for (;;) {
        const rows = await runQuery(
          opts.pool,
          expire,
          { olderThanMs: opts.retentionMs, limit: batchSize },
          runOptions,
        );
        result.batches++;
        let deleted = 0;
        for (const row of rows) {
          deleted += row.deleted;
          result.byQueue[row.queue] = (result.byQueue[row.queue] ?? 0) + row.deleted;
        }
        result.deleted += deleted;
        emit(rows);
        // A short batch: nothing old is left, or what is left is locked by someone else (the next run's).
        if (deleted < batchSize || stopped) break;
        await pause();
        if (stopped) break;
      }
      if (result.deleted > 0) {
        const [left] = await runQuery(opts.pool, oldest, {}, runOptions);
        log.info(
          {
            deleted: result.deleted,
            byQueue: result.byQueue,
            batches: result.batches,
            durationMs: Date.now() - started,
            oldestKeptDeadAt: left?.dead_at ?? null,
            oldestKeptAgeS: left?.age_s ?? null,
            retentionMs: opts.retentionMs,
          },
          "expired dead letters deleted",
        );
      }
      refusedBefore = false;
    } catch (error) {
      result.error = error;
      if ((error as { code?: unknown } | null)?.code === "42501") {
        // A right taken away (or never given): one line naming the grant, not the same error every run.
        if (!refusedBefore) {
          log.error(
            { error: (error as Error).message, retentionMs: opts.retentionMs },
            "dead-letter retention refused: the worker's role may not expire dead letters; as the schema's owner, run `outbox-worker grant --worker <role> --worker-can-expire` (with the role's other options); retention tries again every run and says nothing more until it works",
          );
        }
        refusedBefore = true;
        return result;
      }
      log.warn(
        { err: error, deleted: result.deleted, batches: result.batches },
        "dead-letter retention failed; the next run tries again",
      );
    }
    return result;
  }

  function runOnce(): Promise<DeadLetterRetentionRun> {
    // One run at a time: a second caller waits for the first, then runs its own.
    const next = (running ?? Promise.resolve()).then(work, work);
    const tracked: Promise<DeadLetterRetentionRun> = next.finally(() => {
      if (running === tracked) running = undefined;
    });
    running = tracked;
    return next;
  }

  function schedule() {
    if (!started || stopped || timer) return;
    timer = setTimeout(
      () => {
        timer = undefined;
        void runOnce().finally(schedule);
      },
      intervalMs + random() * jitterMs,
    );
    timer.unref();
  }

  return {
    start() {
      if (started || stopped) return;
      started = true;
      log.info(
        { retentionMs: opts.retentionMs, intervalMs, batchSize },
        "dead-letter retention on: deleting dead letters older than the retention",
      );
      // The first run comes after a random part of the jitter, not at once: replicas restarted together
      // (a deploy) then do not all start deleting in the same second, next to the worker's own start.
      timer = setTimeout(() => {
        timer = undefined;
        void runOnce().finally(schedule);
      }, random() * jitterMs);
      timer.unref();
    },
    runOnce,
    onExpired(listener) {
      listeners.add(listener);
      return () => listeners.delete(listener);
    },
    async stop() {
      stopped = true;
      clearTimeout(timer);
      timer = undefined;
      wakePause?.();
      await running?.catch(() => {});
    },
  };
}
