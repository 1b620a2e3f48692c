import type { Gauge } from "prom-client";
import type { QueueStatus } from "../inspect/status.js";
import type { MetricMakers } from "./metric-makers.js";

type QueueGauge = keyof Omit<QueueStatus, "queue">;

/** Each queue's state from the database (`queueStatus`), one gauge per column. */
export function createQueueGauges(make: MetricMakers): (rows: QueueStatus[]) => void {
  const { gauge } = make;
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

  return (rows) => {
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
  };
}
