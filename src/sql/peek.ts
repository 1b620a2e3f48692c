import { defineQuery, type NoParams, type Query } from "./executor.js";
import type { OutboxNames } from "./names.js";
import type { MessageColumns } from "./rows.js";

/** The states of the `unprocessed` view, in the order a message usually goes through them. */
export const MESSAGE_STATES = ["scheduled", "blocked", "ready", "leased", "lease_expired"] as const;
/**
 * Where an undelivered message stands: `scheduled` (not due yet), `ready` (due, not leased), `leased` (a
 * worker holds it) or `lease_expired` (its worker's lease ran out: it will be fetched again).
 */
export type MessageState = (typeof MESSAGE_STATES)[number];

/** One row of the `unprocessed` view, as peek returns it. */
export interface PeekRow extends MessageColumns {
  state: MessageState;
  /** Seconds since the message was created. */
  age_s: number;
  acquired_at: Date | null;
  acquired_by: string | null;
  lease_expires_at: Date | null;
  last_error: string | null;
}

export interface PeekParams {
  /** Only this queue; null for every queue. */
  queue: string | null;
  /** Only this state; null for every state. */
  state: MessageState | null;
  limit: number;
}

/** The columns of a {@link PeekRow}, read from the `unprocessed` view. */
export const PEEK_COLUMNS = `id, queue, key, state, extract(epoch FROM age)::float8 AS age_s, payload, headers, created_at,
       available_at, acquired_at, acquired_by, lease_expires_at, deliveries_count, attempts_count,
       failures_count, first_attempt_at, last_attempt_at, last_error`;

// Run rarely, on executors the caller hands in (maybe behind a pooler): unnamed, not prepared.

/**
 * Rows of the view, oldest first. A plain read: no FOR UPDATE, so it neither waits for a worker's row lock
 * nor takes one, and it writes nothing.
 */
export function peekStatement(names: OutboxNames): Query<PeekParams, PeekRow> {
  return defineQuery(
    "peek",
    `SELECT ${PEEK_COLUMNS}
FROM ${names.unprocessed}
WHERE ($1::text IS NULL OR queue = $1::text) AND ($2::text IS NULL OR state = $2::text)
ORDER BY created_at, id
LIMIT $3::int`,
    (p) => [p.queue, p.state, p.limit],
  );
}

/** One (queue, state) group of the view. */
export interface UnprocessedSummaryRow {
  queue: string;
  state: MessageState;
  rows: number;
  /** Seconds since the group's oldest message was created. */
  oldest_s: number;
}

/** Per queue and state: how many messages wait and the oldest one's age, read through the view. */
export function unprocessedSummaryStatement(names: OutboxNames): Query<NoParams, UnprocessedSummaryRow> {
  return defineQuery(
    "unprocessed_summary",
    `SELECT queue, state, count(*)::int AS rows, extract(epoch FROM max(age))::float8 AS oldest_s
FROM ${names.unprocessed}
GROUP BY 1, 2
ORDER BY 1, 2`,
    () => [],
  );
}
