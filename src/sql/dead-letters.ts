import { type Statement, statement } from "./executor.js";
import type { OutboxNames } from "./names.js";
import type { MessageColumns } from "./rows.js";

/** A dead letter with every column, plus its age. */
export interface DeadLetterRow extends MessageColumns {
  /** The worker that held the message last. */
  acquired_by: string | null;
  /** When it was dead-lettered (server clock). */
  dead_at: Date;
  /** `rejected`, `invalid_payload`, `retries_exhausted`, `max_deliveries` or `no_handler`. */
  reason: string;
  /** The last error's message, if any. */
  error: string | null;
  /** Seconds since the message was dead-lettered. */
  dead_age_s: number;
}

const DEAD_LETTER_COLUMNS = `id, queue, payload, headers, key, created_at, available_at, acquired_by, deliveries_count,
       attempts_count, failures_count, first_attempt_at, last_attempt_at, dead_at, reason, error,
       extract(epoch FROM now() - dead_at)::float8 AS dead_age_s`;

/** $1 queue or null, $2 reason or null, $3 limit → rows, most recently dead first. */
export function listDeadLettersStatement(names: OutboxNames): Statement {
  return statement(
    "dead_list",
    `SELECT ${DEAD_LETTER_COLUMNS}
FROM ${names.deadLetters}
WHERE ($1::text IS NULL OR queue = $1::text) AND ($2::text IS NULL OR reason = $2::text)
ORDER BY dead_at DESC, id DESC
LIMIT $3::int`,
  );
}

/** $1 id → the row, or none. */
export function getDeadLetterStatement(names: OutboxNames): Statement {
  return statement(
    "dead_get",
    `SELECT ${DEAD_LETTER_COLUMNS} FROM ${names.deadLetters} WHERE id = $1::bigint`,
  );
}

/** Per queue: rows moved back (or that would be) and rows left in place because their id is taken. */
export interface ReplayCountRow {
  queue: string;
  replayed: number;
  skipped: number;
  skipped_ids: string[];
}

/** $1 ids or null, $2 queue or null, $3 reason or null: every given filter must match. */
const REPLAY_FILTER = `($1::bigint[] IS NULL OR d.id = ANY($1::bigint[]))
  AND ($2::text IS NULL OR d.queue = $2::text)
  AND ($3::text IS NULL OR d.reason = $3::text)`;

/**
 * $1 ids, $2 queue, $3 reason (see REPLAY_FILTER), $4 wake channel → ReplayCountRow per queue.
 *
 * One statement, so it is one transaction on any executor, a pool included. A dead letter is deleted only
 * when its row was inserted: an id already in messages is skipped (ON CONFLICT) and stays a dead letter.
 * FOR UPDATE makes a concurrent replay of the same rows wait, then find them gone, rather than insert
 * them twice. The message keeps its id, key, headers and created_at; counters and attempt times start
 * over, and last_error keeps the reason it died so the next delivery is not a mystery. One wake-up per
 * queue that got rows, delivered at commit.
 */
export function replayDeadLettersStatement(names: OutboxNames): Statement {
  return statement(
    "dead_replay",
    `WITH picked AS (
  SELECT d.* FROM ${names.deadLetters} AS d
  WHERE ${REPLAY_FILTER}
  FOR UPDATE
), inserted AS (
  INSERT INTO ${names.messages}
    (id, queue, payload, headers, key, created_at, available_at, deliveries_count, attempts_count,
     failures_count, last_error)
  OVERRIDING SYSTEM VALUE
  SELECT id, queue, payload, headers, key, created_at, now(), 0, 0, 0, error FROM picked
  ON CONFLICT (id) DO NOTHING
  RETURNING id
), removed AS (
  DELETE FROM ${names.deadLetters} AS d USING inserted AS i WHERE d.id = i.id
  RETURNING d.id
), outcome AS (
  SELECT p.queue, count(r.id)::int AS replayed, (count(*) - count(r.id))::int AS skipped,
         COALESCE(array_agg(p.id::text ORDER BY p.id) FILTER (WHERE r.id IS NULL), '{}') AS skipped_ids
  FROM picked AS p LEFT JOIN removed AS r ON r.id = p.id
  GROUP BY p.queue
)
SELECT o.queue, o.replayed, o.skipped, o.skipped_ids
FROM outcome AS o
CROSS JOIN LATERAL (SELECT CASE WHEN o.replayed > 0 THEN pg_notify($4::text, o.queue) END) AS wake
ORDER BY o.queue`,
  );
}

/** $1 ids, $2 queue, $3 reason → ReplayCountRow per queue, as replay would report it; changes nothing. */
export function previewReplayStatement(names: OutboxNames): Statement {
  return statement(
    "dead_replay_preview",
    `SELECT d.queue, count(*) FILTER (WHERE m.id IS NULL)::int AS replayed, count(m.id)::int AS skipped,
       COALESCE(array_agg(d.id::text ORDER BY d.id) FILTER (WHERE m.id IS NOT NULL), '{}') AS skipped_ids
FROM ${names.deadLetters} AS d LEFT JOIN ${names.messages} AS m ON m.id = d.id
WHERE ${REPLAY_FILTER}
GROUP BY d.queue
ORDER BY d.queue`,
  );
}

export interface PurgeCountRow {
  queue: string;
  purged: number;
}

const PURGE_FILTER = `dead_at < now() - $1::double precision * interval '1 millisecond'
  AND ($2::text IS NULL OR queue = $2::text)`;

/** $1 age in ms, $2 queue or null → PurgeCountRow per queue of the rows deleted. */
export function purgeDeadLettersStatement(names: OutboxNames): Statement {
  return statement(
    "dead_purge",
    `WITH gone AS (
  DELETE FROM ${names.deadLetters} WHERE ${PURGE_FILTER}
  RETURNING queue
)
SELECT queue, count(*)::int AS purged FROM gone GROUP BY queue ORDER BY queue`,
  );
}

/** $1 age in ms, $2 queue or null → PurgeCountRow per queue of the rows purge would delete. */
export function previewPurgeStatement(names: OutboxNames): Statement {
  return statement(
    "dead_purge_preview",
    `SELECT queue, count(*)::int AS purged FROM ${names.deadLetters}
WHERE ${PURGE_FILTER}
GROUP BY queue ORDER BY queue`,
  );
}
