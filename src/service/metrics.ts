import type pg from "pg";
import pino, { type Logger } from "pino";
import { collectDefaultMetrics, Registry } from "prom-client";
import { queueStatus } from "../inspect/status.js";
import type { Worker } from "../worker/worker.js";
import type { DeadLetterRetention } from "./dead-letter-retention.js";
import { createGaugeRefresh, refreshFailures } from "./gauge-refresh.js";
import { metricMakers } from "./metric-makers.js";
import { createQueueGauges } from "./queue-gauges.js";
import { createRelayGauges } from "./relay-gauges.js";
import type { RelayStatus } from "./relay-status.js";
import { createTableGauges } from "./table-gauges.js";
import { createTopicGauges } from "./topic-gauges.js";
import { workerEventCounters, workerEventMetrics, workerEventTimings } from "./worker-event-metrics.js";

export { OTHER_TOPICS_LABEL } from "./topic-gauges.js";

export interface MetricsOptions {
  pool: pg.Pool;
  schema: string;
  /** Where the metrics are registered; a fresh registry when omitted. */
  registry?: Registry;
  /** Period of the queue gauge refresh; one `queueStatus` query per period. */
  gaugeIntervalMs?: number;
  /** Also export the process and Node.js runtime metrics of prom-client. */
  collectDefault?: boolean;
  logger?: Logger;
}

export interface Metrics {
  readonly registry: Registry;
  /** Count the worker's events from now on; returns the unsubscribe function. */
  observe(worker: Worker): () => void;
  /** Count the dead letters the retention job deletes from now on; returns the unsubscribe function. */
  observeRetention(retention: DeadLetterRetention): () => void;
  /** Export each relay's state (`outbox_relay_state`), checked at every gauge refresh. */
  observeRelays(relays: RelayStatus): void;
  /** Refresh the queue gauges periodically. The timer does not hold the process open. */
  start(): void;
  /** Refresh the queue gauges now; waits for a refresh already running, then runs a fresh one. */
  refresh(): Promise<void>;
  /** Stop the periodic refresh and wait for a running one. Worker subscriptions stay until unsubscribed. */
  stop(): Promise<void>;
}

const DEFAULT_GAUGE_INTERVAL_MS = 5000;

/** Prometheus metrics for one outbox schema: worker events as counters, queue state as gauges. */
export function createMetrics(opts: MetricsOptions): Metrics {
  const registry = opts.registry ?? new Registry();
  const log = (opts.logger ?? pino({ name: "outbox-metrics" })).child({ schema: opts.schema });
  // A shared registry may already carry them (the app's own prom-client setup): registering twice throws.
  if ((opts.collectDefault ?? true) && !registry.getSingleMetric("process_cpu_user_seconds_total")) {
    collectDefaultMetrics({ register: registry });
  }
  const make = metricMakers(registry);
  // Registered in the order the exposition has always listed them.
  const counters = workerEventCounters(make);
  const refreshFailed = refreshFailures(make, log);
  const events = workerEventMetrics(counters, workerEventTimings(make));
  const setQueueGauges = createQueueGauges(make);
  const setRelayGauges = createRelayGauges(make);
  const refreshTopics = createTopicGauges(make, log);
  const refreshTable = createTableGauges(make);
  let relays: RelayStatus | undefined;

  const gauges = createGaugeRefresh(
    () =>
      // Two connections at most, as the pool sizes for: the topic statements follow the table's. The
      // relays' check never rejects, and is set even when the database is down.
      Promise.all([
        queueStatus(opts.pool, opts.schema),
        refreshTable(opts.pool, opts.schema).then(() => refreshTopics(opts.pool, opts.schema)),
        relays?.check().then(setRelayGauges),
      ]).then(
        ([rows]) => setQueueGauges(rows),
        (error: unknown) => {
          refreshFailed(error);
          throw error;
        },
      ),
    opts.gaugeIntervalMs ?? DEFAULT_GAUGE_INTERVAL_MS,
  );

  return {
    registry,
    ...events,
    observeRelays(status) {
      relays = status;
    },
    ...gauges,
  };
}
