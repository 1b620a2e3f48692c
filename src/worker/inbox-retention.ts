import type { Logger } from "pino";
import { type Executor, runQuery } from "../sql/executor.js";
import { inboxStatements } from "../sql/inbox.js";
import type { OutboxNames } from "../sql/names.js";

export interface InboxRetentionOptions {
  /** Where the batches run (each takes one connection, briefly); a function: the pool exists once started. */
  pool: () => Executor;
  names: OutboxNames;
  /** Records handled longer ago than this are deleted. */
  retentionMs: number;
  /** Time between runs, plus up to a fifth of it at random; default 60 s. */
  intervalMs?: number;
  /** Most records one statement deletes; default 500. */
  batchSize?: number;
  /** Pause between two batches of a run; default 100 ms. */
  pauseMs?: number;
  queryTimeoutMs: number;
  log: Logger;
}

/** What one run deleted. */
export interface InboxRetentionRun {
  deleted: number;
  /** Statements run, the last (short) one included. */
  batches: number;
  error?: unknown;
}

export interface InboxRetention {
  start(): void;
  /** One run now, batch after batch until one is short. Never throws. */
  runOnce(): Promise<InboxRetentionRun>;
  /** No more runs; waits for a running one, which stops after its current batch. */
  stop(): Promise<void>;
}

/**
 * Deletes the worker inbox's expired records. It runs in the worker itself (library users run no service),
 * only when a queue has an inbox: short batches through expire_inbox (oldest first by the handled_at index,
 * SKIP LOCKED, so workers running it at once never wait for each other), paused between batches so the
 * worker's own statements get their connections. A failure is logged; the next run tries again.
 */
export function createInboxRetention(opts: InboxRetentionOptions): InboxRetention {
  const expire = inboxStatements(opts.names, { synchronousCommit: true }).expire;
  const intervalMs = opts.intervalMs ?? 60_000;
  const batchSize = opts.batchSize ?? 500;
  const pauseMs = opts.pauseMs ?? 100;
  let timer: NodeJS.Timeout | undefined;
  let stopped = false;
  let running: Promise<InboxRetentionRun> | undefined;

  async function work(): Promise<InboxRetentionRun> {
    const result: InboxRetentionRun = { deleted: 0, batches: 0 };
    try {
      for (;;) {
        const rows = await runQuery(
          opts.pool(),
          expire,
          { olderThanMs: opts.retentionMs, limit: batchSize },
          { timeoutMs: opts.queryTimeoutMs },
        );
        result.batches++;
        const deleted = rows.reduce((n, r) => n + r.deleted, 0);
        result.deleted += deleted;
        if (deleted < batchSize || stopped) break;
        await new Promise((resolve) => setTimeout(resolve, pauseMs));
        if (stopped) break;
      }
      if (result.deleted > 0) {
        opts.log.info(
          { deleted: result.deleted, batches: result.batches, retentionMs: opts.retentionMs },
          "expired inbox records deleted",
        );
      }
    } catch (error) {
      result.error = error;
      opts.log.warn(
        { err: error, deleted: result.deleted },
        "inbox retention failed (the worker's role needs EXECUTE on expire_inbox: outbox-worker grant --worker <role>); the next run tries again",
      );
    }
    return result;
  }

  function runOnce(): Promise<InboxRetentionRun> {
    const next = (running ?? Promise.resolve()).then(work, work);
    const tracked = next.finally(() => {
      if (running === tracked) running = undefined;
    });
    running = tracked;
    return next;
  }

  function schedule(first: boolean): void {
    if (stopped) return;
    // The first run after a random part of the interval: replicas started together do not run together.
    const wait = first ? Math.random() * intervalMs : intervalMs + (Math.random() * intervalMs) / 5;
    timer = setTimeout(() => {
      timer = undefined;
      void runOnce().finally(() => schedule(false));
    }, wait);
    timer.unref();
  }

  return {
    start: () => schedule(true),
    runOnce,
    async stop() {
      stopped = true;
      clearTimeout(timer);
      timer = undefined;
      await running?.catch(() => {});
    },
  };
}
