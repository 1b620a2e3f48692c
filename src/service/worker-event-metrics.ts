import { Histogram } from "prom-client";
import type { ListenerState } from "../notify/notifier.js";
import type { Worker } from "../worker/worker.js";
import type { DeadLetterRetention } from "./dead-letter-retention.js";
import type { MetricMakers } from "./metric-makers.js";

/** 1 ms to 60 s: handlers range from an in-memory write to a slow remote call. */
const DURATION_BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60];
const LISTENER_STATES = Object.keys({
  connecting: true,
  listening: true,
  reconnecting: true,
  poll_only: true,
  stopped: true,
} satisfies Record<ListenerState, true>) as ListenerState[];

/** What a worker and the dead-letter retention job tell as events, counted. */
export interface WorkerEventMetrics {
  /** Count the worker's events from now on; returns the unsubscribe function. */
  observe(worker: Worker): () => void;
  /** Count the dead letters the retention job deletes from now on; returns the unsubscribe function. */
  observeRetention(retention: DeadLetterRetention): () => void;
}

/** The worker's and the retention job's event counters. */
export function workerEventCounters(make: MetricMakers) {
  const { counter } = make;
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
  return {
    fetched,
    acked,
    deduped,
    retried,
    dead,
    leaseLost,
    timeouts,
    loopErrors,
    released,
    reclaimed,
    expiredDead,
  };
}

/** Handler run times, event-loop blocks and the LISTEN connection's state. */
export function workerEventTimings(make: MetricMakers) {
  const { gauge, registers } = make;
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
  return { duration, blocked, listener };
}

/** Counts the events of workers and retention jobs on the counters and timings. */
export function workerEventMetrics(
  counters: ReturnType<typeof workerEventCounters>,
  timings: ReturnType<typeof workerEventTimings>,
): WorkerEventMetrics {
  const { fetched, acked, deduped, retried, dead, leaseLost, timeouts, loopErrors, released, reclaimed } =
    counters;
  const { duration, blocked, listener } = timings;

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
    observe,
    observeRetention: (retention) =>
      retention.onExpired((e) => counters.expiredDead.inc({ queue: e.queue }, e.count)),
  };
}
