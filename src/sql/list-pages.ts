import { defineQuery, type Query } from "./executor.js";
import type { OutboxNames } from "./names.js";
import { type MessageState, PEEK_COLUMNS, type PeekRow } from "./peek.js";

// Pages of a list for a screen that refreshes every few seconds: keyset by id (each page an index range
// scan, however deep), and free text cut to a preview in the database, so a 1 MB payload is neither
// sent nor parsed for a list row. Run rarely, on the console's pool: unnamed, not prepared.

/** The parts of a list row that can be long, cut to a preview. */
export interface PreviewColumns {
  /** The first characters of the payload's JSON text. */
  payload_preview: string;
  /** The size of the payload's JSON text, in bytes. */
  payload_bytes: number;
  /** Whether payload_preview is cut. */
  payload_truncated: boolean;
  /** The ordering key, cut to the preview length. */
  key: string | null;
  acquired_by: string | null;
}

/** One row of a page of the `unprocessed` view. */
export interface MessagePageRow extends PreviewColumns {
  id: string;
  queue: string;
  state: MessageState;
  /** Seconds since the message was created. */
  age_s: number;
  created_at: Date;
  available_at: Date;
  acquired_at: Date | null;
  lease_expires_at: Date | null;
  deliveries_count: number;
  attempts_count: number;
  failures_count: number;
  last_attempt_at: Date | null;
  /** The last error, cut to the preview length. */
  last_error: string | null;
  last_error_truncated: boolean;
}

/** One row of a page of dead letters. */
export interface DeadLetterPageRow extends PreviewColumns {
  id: string;
  queue: string;
  reason: string;
  dead_at: Date;
  /** Seconds since the message was dead-lettered. */
  dead_age_s: number;
  created_at: Date;
  deliveries_count: number;
  attempts_count: number;
  failures_count: number;
  /** The error, cut to the preview length. */
  error: string | null;
  error_truncated: boolean;
}

export interface PageParams {
  queue: string | null;
  /** The state (messages) or the reason (dead letters); null for any. */
  kind: string | null;
  /** The last id of the page before (exclusive); null for the first page. */
  cursor: string | null;
  limit: number;
  /** Characters kept of each long text. */
  previewChars: number;
}

const PREVIEW = (
  alias: string,
) => `left(${alias}.key, $5::int) AS key, left(${alias}.acquired_by, $5::int) AS acquired_by,
       left(t.payload, $5::int) AS payload_preview, octet_length(t.payload) AS payload_bytes,
       char_length(t.payload) > $5::int AS payload_truncated`;

/** Rows of the view in id order (oldest first), after the cursor. */
export function messagePageStatement(names: OutboxNames): Query<PageParams, MessagePageRow> {
  return defineQuery(
    "message_page",
    `SELECT u.id, u.queue, u.state, extract(epoch FROM u.age)::float8 AS age_s, u.created_at, u.available_at,
       u.acquired_at, u.lease_expires_at, u.deliveries_count, u.attempts_count, u.failures_count,
       u.last_attempt_at, left(u.last_error, $5::int) AS last_error,
       COALESCE(char_length(u.last_error) > $5::int, false) AS last_error_truncated,
       ${PREVIEW("u")}
FROM ${names.unprocessed} AS u
CROSS JOIN LATERAL (SELECT u.payload::text AS payload) AS t
WHERE ($1::text IS NULL OR u.queue = $1::text) AND ($2::text IS NULL OR u.state = $2::text)
  AND u.id > COALESCE($3::bigint, 0)
ORDER BY u.id
LIMIT $4::int`,
    (p) => [p.queue, p.kind, p.cursor, p.limit, p.previewChars],
  );
}

/** Dead letters, highest id first, below the cursor. */
export function deadLetterPageStatement(names: OutboxNames): Query<PageParams, DeadLetterPageRow> {
  return defineQuery(
    "dead_page",
    `SELECT d.id, d.queue, d.reason, d.dead_at, extract(epoch FROM now() - d.dead_at)::float8 AS dead_age_s,
       d.created_at, d.deliveries_count, d.attempts_count, d.failures_count,
       left(d.error, $5::int) AS error, COALESCE(char_length(d.error) > $5::int, false) AS error_truncated,
       ${PREVIEW("d")}
FROM ${names.deadLetters} AS d
CROSS JOIN LATERAL (SELECT d.payload::text AS payload) AS t
WHERE ($1::text IS NULL OR d.queue = $1::text) AND ($2::text IS NULL OR d.reason = $2::text)
  AND d.id < COALESCE($3::bigint, 9223372036854775807)
ORDER BY d.id DESC
LIMIT $4::int`,
    (p) => [p.queue, p.kind, p.cursor, p.limit, p.previewChars],
  );
}

/** The row of the view with this id (a decimal string), whole, or no row. */
export function getMessageStatement(names: OutboxNames): Query<{ id: string }, PeekRow> {
  return defineQuery(
    "message_get",
    `SELECT ${PEEK_COLUMNS}
FROM ${names.unprocessed}
WHERE id = $1::bigint`,
    (p) => [p.id],
  );
}
