import { type Statement, statement } from "./executor.js";
import type { OutboxNames } from "./names.js";
import type { MessageColumns } from "./rows.js";

/** The states of the `unprocessed` view, in the order a message usually goes through them. */
export const MESSAGE_STATES = ["scheduled", "ready", "leased", "lease_expired"] as const;
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

/**
 * $1 queue or null, $2 state or null, $3 limit → rows, oldest first. A plain read of the view: no
 * FOR UPDATE, so it neither waits for a worker's row lock nor takes one, and it writes nothing.
 */
export function peekStatement(names: OutboxNames): Statement {
  return statement(
    "peek",
    `SELECT id, queue, key, state, extract(epoch FROM age)::float8 AS age_s, payload, headers, created_at,
       available_at, acquired_at, acquired_by, lease_expires_at, deliveries_count, attempts_count,
       failures_count, first_attempt_at, last_attempt_at, last_error
FROM ${names.unprocessed}
WHERE ($1::text IS NULL OR queue = $1::text) AND ($2::text IS NULL OR state = $2::text)
ORDER BY created_at, id
LIMIT $3::int`,
  );
}
