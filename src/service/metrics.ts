import type pg from "pg";
import pino, { type Logger } from "pino";
import { Counter, collectDefaultMetrics, Gauge, Histogram, Registry } from "prom-client";
import { type QueueStatus, queueStatus } from "../inspect/status.js";
import { type TopicStatus, topicStatus } from "../inspect/subscriptions-status.js";
import { tableHealth } from "../inspect/table-health.js";
import type { ListenerState } from "../notify/notifier.js";
import type { Worker } from "../worker/worker.js";
import type { DeadLetterRetention } from "./dead-letter-retention.js";
import { RELAY_STATES, type RelayStatus, type RelaysReport } from "./relay-status.js";

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
const ERROR_LOG_INTERVAL_MS = 60_000;
/** 1 ms to 60 s: handlers range from an in-memory write to a slow remote call. */
const DURATION_BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60];
const LISTENER_STATES = Object.keys({
  connecting: true,
  listening: true,
  reconnecting: true,
  poll_only: true,
  stopped: true,
} satisfies Record<ListenerState, true>) as ListenerState[];

type QueueGauge = keyof Omit<QueueStatus, "queue">;

/**
 * Topics are named by producers, not declared: a bug could publish to many. The gauge keeps a series for
 * the topics with the most kept events and sums the rest under one label no topic can have.
 */
const UNROUTED_TOPIC_SERIES = 50;
export const OTHER_TOPICS_LABEL = "(other)";

/** Prometheus metrics for one outbox schema: worker events as counters, queue state as gauges. */
export function createMetrics(opts: MetricsOptions): Metrics {
  const registry = opts.registry ?? new Registry();
  const intervalMs = opts.gaugeIntervalMs ?? DEFAULT_GAUGE_INTERVAL_MS;
  const log = (opts.logger ?? pino({ name: "outbox-metrics" })).child({ schema: opts.schema });
  const registers = [registry];
  // A shared registry may already carry them (the app's own prom-client setup): registering twice throws.
  if ((opts.collectDefault ?? true) && !registry.getSingleMetric("process_cpu_user_seconds_total")) {
    collectDefaultMetrics({ register: registry });
  }

  const counter = <L extends string>(name: string, help: string, labelNames: L[] = []) =>
    new Counter<L>({ name, help, labelNames, registers });
  const gauge = <L extends string>(name: string, help: string, labelNames: L[]) =>
    new Gauge<L>({ name, help, labelNames, registers });

  const fetched = counter("outbox_fetched_total", "Rows leased by fetches.");
  const acked = counter("outbox_acked_total", "Messages handled and deleted.", ["queue"]);
  const deduped = counter(
    "outbox_messages_deduped_total",
    "Messages acked without running the handler: the queue's inbox showed them handled already.",
    ["queue"],
  );
  const retried = counter("outbox_retried_total", "Handler failures scheduled for a retry.", [
    "queue",
    "transient",
  ]);
  const dead = counter("outbox_dead_lettered_total", "Messages moved to dead letters.", ["queue", "reason"]);
  const leaseLost = counter("outbox_lease_lost_total", "Leases taken over by another worker.", [
    "queue",
    "phase",
  ]);
  const timeouts = counter(
    "outbox_handler_timeouts_total",
    "Handlers aborted for running past their timeout.",
    ["queue"],
  );
  const loopErrors = counter("outbox_loop_errors_total", "Failed database round trips per loop.", ["loop"]);
  const released = counter("outbox_released_total", "Fetched rows handed back unstarted on stop.");
  const reclaimed = counter(
    "outbox_reclaimed_total",
    "Rows a database crash left under this worker's own leases, made due at once instead of after the lease TTL.",
    ["queue"],
  );
  const expiredDead = counter(
    "outbox_dead_letters_expired_total",
    "Dead letters deleted by the retention job (deadLetterRetentionMs).",
    ["queue"],
  );
  const refreshErrors = counter("outbox_gauge_refresh_errors_total", "Failed queue gauge refreshes.");
  const duration = new Histogram<"queue">({
    name: "outbox_handler_duration_seconds",
    help: "Handler run time of acked messages.",
    labelNames: ["queue"],
    buckets: DURATION_BUCKETS,
    registers,
  });
  const blocked = new Histogram({
    name: "outbox_event_loop_blocked_seconds",
    help: "Times the event loop was blocked long enough to delay lease renewals, by how long.",
    buckets: [0.1, 0.5, 1, 5, 10, 30, 60],
    registers,
  });
  const listener = gauge("outbox_listener_state", "1 for the LISTEN connection's current state.", ["state"]);
  for (const state of LISTENER_STATES) listener.set({ state }, 0);

  const queueGauges: Record<QueueGauge, Gauge<"queue">> = {
    ready: gauge("outbox_backlog", "Messages ready for delivery now.", ["queue"]),
    blocked: gauge(
      "outbox_blocked",
      "Messages waiting behind an earlier message of their key (per-key ordering).",
      ["queue"],
    ),
    scheduled: gauge("outbox_scheduled", "Messages waiting for their available_at.", ["queue"]),
    leased: gauge("outbox_leased", "Messages under a live lease.", ["queue"]),
    expired: gauge("outbox_lease_expired", "Messages whose lease expired unfinished.", ["queue"]),
    dead: gauge("outbox_dead_letters", "Rows in dead_letters.", ["queue"]),
    oldest_ready_age_s: gauge(
      "outbox_oldest_ready_age_seconds",
      "Seconds the oldest ready message has been deliverable; 0 when none is ready.",
      ["queue"],
    ),
    oldest_dead_age_s: gauge(
      "outbox_oldest_dead_letter_age_seconds",
      "Seconds since the oldest dead letter died; 0 when there is none.",
      ["queue"],
    ),
  };
  const seenQueues = new Set<string>();
  const relayState = gauge(
    "outbox_relay_state",
    "1 for a built-in relay's current state (ok, unreachable, misconfigured, connecting), per queue.",
    ["queue", "type", "state"],
  );
  let relays: RelayStatus | undefined;
  const subscriptions = gauge(
    "outbox_subscriptions",
    "Topic patterns the queue is subscribed to (rows of the subscriptions table).",
    ["queue"],
  );
  const unrouted = gauge(
    "outbox_unrouted_events",
    `Events kept as dead letters no_subscribers: published to a topic no queue subscribed to. At most ${UNROUTED_TOPIC_SERIES} topics, the rest summed under topic="${OTHER_TOPICS_LABEL}".`,
    ["topic"],
  );
  const subscribedQueues = new Set<string>();
  let unroutedTopics = new Set<string>();
  let subscriptionsHidden = false;
  const table = {
    dead: gauge("outbox_table_dead_tuples", "Dead row versions in the messages table, not vacuumed yet.", []),
    bytes: gauge("outbox_table_size_bytes", "The messages table with its indexes and TOAST.", []),
    lastVacuum: gauge(
      "outbox_table_last_vacuum_timestamp_seconds",
      "When the messages table was last (auto)vacuumed, Unix time; 0 when never.",
      [],
    ),
    autovacuum: gauge(
      "outbox_table_autovacuum_enabled",
      "1 when autovacuum runs for the messages table.",
      [],
    ),
  };

  async function refreshTable(): Promise<void> {
    const health = await tableHealth(opts.pool, opts.schema);
    if (!health) return;
    table.dead.set(health.dead_tuples);
    table.bytes.set(health.total_bytes);
    const last = health.last_autovacuum ?? health.last_vacuum;
    table.lastVacuum.set(last ? last.getTime() / 1000 : 0);
    table.autovacuum.set(health.autovacuum_enabled ? 1 : 0);
  }

  async function refreshTopics(): Promise<void> {
    setTopicGauges(await topicStatus(opts.pool, opts.schema, { limit: UNROUTED_TOPIC_SERIES }));
  }

  function setTopicGauges(topics: TopicStatus) {
    if (topics.subscriptions === null) {
      // A worker role granted without SELECT on subscriptions: no series rather than a wrong 0. Info, once:
      // most roles are granted so, and an outbox that uses no topics loses nothing.
      if (!subscriptionsHidden) {
        log.info("outbox_subscriptions is not exported: this role may not read the subscriptions table");
      }
      subscriptionsHidden = true;
      subscriptions.reset();
      subscribedQueues.clear();
    } else {
      subscriptionsHidden = false;
      const counts = new Map<string, number>();
      for (const s of topics.subscriptions) {
        for (const queue of s.queues) counts.set(queue, (counts.get(queue) ?? 0) + 1);
      }
      // A queue unsubscribed from everything drops out of the query: 0, not its last count.
      for (const queue of subscribedQueues) if (!counts.has(queue)) counts.set(queue, 0);
      for (const [queue, n] of counts) {
        subscriptions.set({ queue }, n);
        subscribedQueues.add(queue);
      }
    }
    // Kept events' topics come and go with producers' mistakes: a topic replayed or purged loses its
    // series instead of keeping a 0 forever, so the label set stays within UNROUTED_TOPIC_SERIES + 1.
    const present = new Set<string>();
    const { unrouted: kept } = topics;
    for (const t of kept.byTopic) {
      unrouted.set({ topic: t.topic }, t.events);
      present.add(t.topic);
    }
    const rest = kept.events - kept.byTopic.reduce((n, t) => n + t.events, 0);
    if (rest > 0) {
      unrouted.set({ topic: OTHER_TOPICS_LABEL }, rest);
      present.add(OTHER_TOPICS_LABEL);
    }
    for (const topic of unroutedTopics) if (!present.has(topic)) unrouted.remove({ topic });
    unroutedTopics = present;
  }

  function setGauges(rows: QueueStatus[]) {
    const present = new Set<string>();
    for (const row of rows) {
      present.add(row.queue);
      seenQueues.add(row.queue);
      for (const [key, g] of Object.entries(queueGauges) as [QueueGauge, Gauge<"queue">][]) {
        g.set({ queue: row.queue }, Number(row[key] ?? 0));
      }
    }
    // A drained queue drops out of the query; left alone its gauges would show the last backlog forever.
    for (const queue of seenQueues) {
      if (present.has(queue)) continue;
      for (const g of Object.values(queueGauges)) g.set({ queue }, 0);
    }
  }

  function setRelayGauges(report: RelaysReport) {
    for (const [queue, relay] of Object.entries(report.relays)) {
      for (const state of RELAY_STATES) {
        relayState.set({ queue, type: relay.type, state }, state === relay.state ? 1 : 0);
      }
    }
  }

  let lastErrorLogAt = Number.NEGATIVE_INFINITY;
  let suppressed = 0;
  function refreshFailed(error: unknown) {
    refreshErrors.inc();
    const now = Date.now();
    if (now - lastErrorLogAt < ERROR_LOG_INTERVAL_MS) {
      suppressed++;
      return;
    }
    log.warn({ err: error, suppressed }, "queue gauge refresh failed");
    lastErrorLogAt = now;
    suppressed = 0;
  }

  let running: Promise<void> | undefined;
  let queued: Promise<void> | undefined;
  function refresh(): Promise<void> {
    if (!running) {
      // Two connections at most, as the pool sizes for: the topic statements follow the table's. The
      // relays' check never rejects, and is set even when the database is down.
      running = Promise.all([
        queueStatus(opts.pool, opts.schema),
        refreshTable().then(refreshTopics),
        relays?.check().then(setRelayGauges),
      ])
        .then(
          ([rows]) => setGauges(rows),
          (error: unknown) => {
            refreshFailed(error);
            throw error;
          },
        )
        .finally(() => {
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

  function observe(worker: Worker): () => void {
    const offs = [
      worker.on("fetched", (e) => fetched.inc(e.count)),
      worker.on("acked", (e) => {
        acked.inc({ queue: e.queue });
        duration.observe({ queue: e.queue }, e.durationMs / 1000);
      }),
      worker.on("deduped", (e) => deduped.inc({ queue: e.queue })),
      worker.on("retried", (e) => retried.inc({ queue: e.queue, transient: String(e.transient) })),
      worker.on("dead_lettered", (e) => dead.inc({ queue: e.queue, reason: e.reason })),
      worker.on("lease_lost", (e) => leaseLost.inc({ queue: e.queue, phase: e.phase })),
      worker.on("handler_timeout", (e) => timeouts.inc({ queue: e.queue })),
      worker.on("loop_error", (e) => loopErrors.inc({ loop: e.loop })),
      worker.on("released", (e) => released.inc(e.count)),
      worker.on("reclaimed", (e) => {
        for (const [queue, n] of Object.entries(e.queues)) reclaimed.inc({ queue }, n);
      }),
      worker.on("event_loop_blocked", (e) => blocked.observe(e.blockedMs / 1000)),
      worker.on("listener", (e) => {
        for (const state of LISTENER_STATES) listener.set({ state }, state === e.state ? 1 : 0);
      }),
    ];
    return () => {
      for (const off of offs) off();
    };
  }

  return {
    registry,
    observe,
    observeRetention: (retention) => retention.onExpired((e) => expiredDead.inc({ queue: e.queue }, e.count)),
    observeRelays(status) {
      relays = status;
    },
    start() {
      if (active) return;
      active = true;
      void refresh()
        .catch(() => {})
        .finally(schedule);
    },
    refresh,
    async stop() {
      active = false;
      clearTimeout(timer);
      timer = undefined;
      await Promise.allSettled([running, queued]);
    },
  };
}
