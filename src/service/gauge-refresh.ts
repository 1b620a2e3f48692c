import type { Logger } from "pino";
import type { MetricMakers } from "./metric-makers.js";

const ERROR_LOG_INTERVAL_MS = 60_000;

/** A failed gauge refresh: counted, and logged at most once a minute (with how many were not). */
export function refreshFailures(make: MetricMakers, log: Logger): (error: unknown) => void {
  const refreshErrors = make.counter("outbox_gauge_refresh_errors_total", "Failed queue gauge refreshes.");
  let lastErrorLogAt = Number.NEGATIVE_INFINITY;
  let suppressed = 0;
  return (error) => {
    refreshErrors.inc();
    const now = Date.now();
    if (now - lastErrorLogAt < ERROR_LOG_INTERVAL_MS) {
      suppressed++;
      return;
    }
    log.warn({ err: error, suppressed }, "queue gauge refresh failed");
    lastErrorLogAt = now;
    suppressed = 0;
  };
}

/** Runs a gauge refresh on demand and every `intervalMs` once started; one at a time. */
export interface GaugeRefresh {
  /** Refresh now; waits for a refresh already running, then runs a fresh one. */
  refresh(): Promise<void>;
  /** Refresh now and periodically. The timer does not hold the process open. */
  start(): void;
  /** Stop the periodic refresh and wait for a running one. */
  stop(): Promise<void>;
}

export function createGaugeRefresh(once: () => Promise<void>, intervalMs: number): GaugeRefresh {
  let running: Promise<void> | undefined;
  let queued: Promise<void> | undefined;
  function refresh(): Promise<void> {
    if (!running) {
      running = once().finally(() => {
        running = undefined;
      });
      return running;
    }
    // A caller may have just changed the rows: the running query could predate that, so queue one more.
    queued ??= running
      .catch(() => {})
      .then(() => {
        queued = undefined;
        return refresh();
      });
    return queued;
  }

  let timer: NodeJS.Timeout | undefined;
  let active = false;
  function schedule() {
    if (!active || timer) return;
    timer = setTimeout(() => {
      timer = undefined;
      refresh()
        .catch(() => {})
        .finally(schedule);
    }, intervalMs);
    timer.unref();
  }

  return {
    refresh,
    start() {
      if (active) return;
      active = true;
      void refresh()
        .catch(() => {})
        .finally(schedule);
    },
    async stop() {
      active = false;
      clearTimeout(timer);
      timer = undefined;
      await Promise.allSettled([running, queued]);
    },
  };
}
