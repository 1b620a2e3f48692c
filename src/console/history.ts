import type { Logger } from "pino";
import { queueStatus } from "../inspect/status.js";
import type { Executor } from "../sql/executor.js";
import type { Worker } from "../worker/worker.js";

/** One point of the console's chart. */
export interface HistorySample {
  /** Epoch milliseconds. */
  t: number;
  /** Ready rows, all queues together: the backlog a worker could take now. */
  ready: number;
  /** Rows acked per second since the sample before (by the workers this process observes). */
  deliveredPerSec: number;
  /** Rows dead-lettered per second since the sample before. */
  deadPerSec: number;
}

export interface History {
  readonly intervalMs: number;
  samples(): HistorySample[];
  /** Count a worker's outcomes; returns the unsubscribe function. */
  observe(worker: Worker): () => void;
  start(): void;
  stop(): Promise<void>;
}

export const DEFAULT_HISTORY_INTERVAL_MS = 5000;
/** What the chart covers. */
export const HISTORY_WINDOW_MS = 10 * 60_000;

/**
 * A ring buffer of backlog and throughput samples over the last ten minutes, kept in memory: the chart
 * needs no table, and a restart only empties it. One queueStatus per interval, whoever is watching.
 */
export function createHistory(opts: {
  db: Executor;
  schema: string;
  intervalMs?: number;
  logger?: Logger;
  now?: () => number;
}): History {
  const intervalMs = opts.intervalMs ?? DEFAULT_HISTORY_INTERVAL_MS;
  const capacity = Math.max(2, Math.ceil(HISTORY_WINDOW_MS / intervalMs));
  const now = opts.now ?? Date.now;
  const ring: HistorySample[] = [];
  let delivered = 0;
  let dead = 0;
  let last = { t: now(), delivered: 0, dead: 0 };
  let timer: NodeJS.Timeout | undefined;
  let running: Promise<void> | undefined;
  let warned = false;

  async function sample(): Promise<void> {
    try {
      const rows = await queueStatus(opts.db, opts.schema);
      const t = now();
      const seconds = Math.max((t - last.t) / 1000, 0.001);
      ring.push({
        t,
        ready: rows.reduce((n, r) => n + r.ready, 0),
        deliveredPerSec: (delivered - last.delivered) / seconds,
        deadPerSec: (dead - last.dead) / seconds,
      });
      if (ring.length > capacity) ring.splice(0, ring.length - capacity);
      last = { t, delivered, dead };
      warned = false;
    } catch (error) {
      // Once per outage: a database down for minutes must not write a line every few seconds.
      if (!warned) opts.logger?.warn({ err: error }, "console history sample failed");
      warned = true;
    }
  }

  return {
    intervalMs,
    samples: () => ring.slice(),
    observe(worker) {
      const offs = [
        worker.on("acked", () => {
          delivered++;
        }),
        worker.on("dead_lettered", () => {
          dead++;
        }),
      ];
      return () => {
        for (const off of offs) off();
      };
    },
    start() {
      if (timer) return;
      last = { t: now(), delivered, dead };
      const tick = () => {
        running = sample().finally(() => {
          running = undefined;
        });
      };
      tick();
      timer = setInterval(() => {
        // A slow database must not pile samples up.
        if (!running) tick();
      }, intervalMs);
      timer.unref();
    },
    async stop() {
      if (timer) clearInterval(timer);
      timer = undefined;
      await running;
    },
  };
}
