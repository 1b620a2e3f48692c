import { type Statement, statement } from "./executor.js";
import type { OutboxNames } from "./names.js";

/**
 * The writes that end or extend a lease. Every one takes parallel arrays of (id, token) and touches a row
 * only while it still carries that token: a worker whose lease was taken over writes 0 rows, so the newer
 * owner always wins. Rows missing from RETURNING are the caller's `lease_lost`.
 *
 * The pairs are joined through unnest. The planner may look each id up by primary key or hash-join over
 * the leased rows (messages_leased_idx); both stay small because only held rows are leased.
 */
export interface CompleteStatements {
  /**
   * $1 ids, $2 tokens → one row: `deleted` count, and `ids` (the deleted ids) only when some were not
   * deleted. The common case (every row still ours) returns no per-row data: at tens of thousands of acks
   * a second, a result row per message costs the worker more than the DELETE costs Postgres.
   */
  ack: Statement;
  /**
   * $1 ids, $2 tokens, $3 delays ms, $4 errors, $5 failure increments (0 or 1), $6 max error length
   * → ids. Clears the lease and schedules the row on the server clock.
   */
  retry: Statement;
  /**
   * $1 ids, $2 tokens, $3 reasons, $4 errors, $5 attempt increments (1 when a handler ran), $6 failure
   * increments, $7 max error length → ids. One statement: the row leaves messages only if it lands in
   * dead_letters.
   */
  dead: Statement;
  /** $1 ids, $2 tokens → ids. Gives unstarted rows back (graceful stop) without counting a delivery. */
  release: Statement;
  /** $1 ids, $2 tokens, $3 lease TTL ms → ids still held. */
  renew: Statement;
}

export interface IdRow {
  id: string;
}

/** The ack statement's one row. */
export interface AckRow {
  deleted: number;
  /** Null when every row was deleted. */
  ids: string[] | null;
}

export function completeStatements(names: OutboxNames): CompleteStatements {
  const m = names.messages;
  const pairs = "unnest($1::bigint[], $2::uuid[])";
  return {
    ack: statement(
      "ack",
      `WITH gone AS (
  DELETE FROM ${m} AS t USING ${pairs} AS d(id, token)
  WHERE t.id = d.id AND t.acquired_token = d.token
  RETURNING t.id
)
SELECT count(*)::int AS deleted,
       -- array_agg of no rows is NULL, not '{}': without COALESCE "none deleted" would read as "all deleted".
       CASE WHEN count(*) < cardinality($1::bigint[]) THEN COALESCE(array_agg(id::text), '{}') END AS ids
FROM gone`,
    ),
    retry: statement(
      "retry",
      `UPDATE ${m} AS t
SET acquired_token = NULL, acquired_at = NULL, lease_expires_at = NULL, acquired_by = NULL,
    available_at = now() + d.delay_ms * interval '1 millisecond',
    attempts_count = t.attempts_count + 1,
    failures_count = t.failures_count + d.failed,
    first_attempt_at = COALESCE(t.first_attempt_at, now()),
    last_attempt_at = now(),
    last_error = left(d.error, $6)
FROM unnest($1::bigint[], $2::uuid[], $3::double precision[], $4::text[], $5::int[])
     AS d(id, token, delay_ms, error, failed)
WHERE t.id = d.id AND t.acquired_token = d.token
RETURNING t.id`,
    ),
    dead: statement(
      "dead",
      `WITH gone AS (
  DELETE FROM ${m} AS t
  USING unnest($1::bigint[], $2::uuid[], $3::text[], $4::text[], $5::int[], $6::int[])
        AS d(id, token, reason, error, attempted, failed)
  WHERE t.id = d.id AND t.acquired_token = d.token
  RETURNING t.*, d.reason, d.error, d.attempted, d.failed
)
INSERT INTO ${names.deadLetters} AS dl
  (id, queue, payload, headers, key, created_at, available_at, acquired_by, deliveries_count, attempts_count,
   failures_count, first_attempt_at, last_attempt_at, dead_at, reason, error)
SELECT id, queue, payload, headers, key, created_at, available_at, acquired_by, deliveries_count,
       attempts_count + attempted, failures_count + failed,
       CASE WHEN attempted > 0 THEN COALESCE(first_attempt_at, now()) ELSE first_attempt_at END,
       CASE WHEN attempted > 0 THEN now() ELSE last_attempt_at END,
       now(), reason, left(COALESCE(error, last_error), $7)
FROM gone
-- A replayed message that dies again replaces its earlier dead letter instead of failing the move.
ON CONFLICT (id) DO UPDATE SET
  queue = excluded.queue, payload = excluded.payload, headers = excluded.headers, key = excluded.key,
  created_at = excluded.created_at, available_at = excluded.available_at, acquired_by = excluded.acquired_by,
  deliveries_count = excluded.deliveries_count, attempts_count = excluded.attempts_count,
  failures_count = excluded.failures_count, first_attempt_at = excluded.first_attempt_at,
  last_attempt_at = excluded.last_attempt_at, dead_at = excluded.dead_at, reason = excluded.reason,
  error = excluded.error
RETURNING dl.id`,
    ),
    release: statement(
      "release",
      `UPDATE ${m} AS t
SET acquired_token = NULL, acquired_at = NULL, lease_expires_at = NULL, acquired_by = NULL,
    deliveries_count = greatest(t.deliveries_count - 1, 0)
FROM ${pairs} AS d(id, token)
WHERE t.id = d.id AND t.acquired_token = d.token
RETURNING t.id`,
    ),
    renew: statement(
      "renew",
      `UPDATE ${m} AS t
SET lease_expires_at = now() + $3::double precision * interval '1 millisecond'
FROM ${pairs} AS d(id, token)
WHERE t.id = d.id AND t.acquired_token = d.token
RETURNING t.id`,
    ),
  };
}
