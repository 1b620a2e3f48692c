import type { OutboxNames } from "./names.js";

/** One queue's numbers, as `status` prints them and the metrics gauges export them. */
export interface QueueStatusRow {
  queue: string;
  ready: number;
  scheduled: number;
  leased: number;
  expired: number;
  dead: number;
  /** Seconds since the oldest ready row became deliverable (its available_at); null when none is ready. */
  oldest_ready_age_s: number | null;
}

/**
 * Per-queue counts by state, plus dead letters. A plain aggregate: it takes no row lock and no lease, so
 * it never slows the worker beyond the read itself. It scans the backlog, so it is run every few seconds,
 * not per message.
 */
export function queueStatusSql(names: OutboxNames): string {
  return `WITH m AS (
  SELECT queue,
         count(*) FILTER (WHERE acquired_token IS NULL AND available_at <= now())::int AS ready,
         count(*) FILTER (WHERE acquired_token IS NULL AND available_at > now())::int AS scheduled,
         count(*) FILTER (WHERE acquired_token IS NOT NULL AND lease_expires_at > now())::int AS leased,
         count(*) FILTER (WHERE acquired_token IS NOT NULL AND lease_expires_at <= now())::int AS expired,
         extract(epoch FROM now() - min(available_at)
                 FILTER (WHERE acquired_token IS NULL AND available_at <= now()))::float8 AS oldest_ready_age_s
  FROM ${names.messages}
  GROUP BY queue
), d AS (
  SELECT queue, count(*)::int AS dead FROM ${names.deadLetters} GROUP BY queue
)
SELECT COALESCE(m.queue, d.queue) AS queue,
       COALESCE(m.ready, 0) AS ready, COALESCE(m.scheduled, 0) AS scheduled,
       COALESCE(m.leased, 0) AS leased, COALESCE(m.expired, 0) AS expired,
       COALESCE(d.dead, 0) AS dead, m.oldest_ready_age_s
FROM m FULL JOIN d ON d.queue = m.queue
ORDER BY 1`;
}
