import { defineQuery, type NoParams, type Query } from "./executor.js";
import { TRY_KEY_LOCK } from "./key-lock.js";
import type { OutboxNames } from "./names.js";
import type { MessageColumns } from "./rows.js";

/** A dead letter with every column, plus its age. */
export interface DeadLetterRow extends MessageColumns {
  /** The worker that held the message last. */
  acquired_by: string | null;
  /** When it was dead-lettered (server clock). */
  dead_at: Date;
  /** `rejected`, `invalid_payload`, `invalid_headers`, `retries_exhausted`, `timeout`, `max_deliveries` or `no_handler`. */
  reason: string;
  /** The last error's message, if any. */
  error: string | null;
  /** Seconds since the message was dead-lettered. */
  dead_age_s: number;
}

const DEAD_LETTER_COLUMNS = `id, queue, payload, headers, key, created_at, available_at, acquired_by, deliveries_count,
       attempts_count, failures_count, first_attempt_at, last_attempt_at, dead_at, reason, error,
       extract(epoch FROM now() - dead_at)::float8 AS dead_age_s`;

// Run rarely, on executors the caller hands in (maybe behind a pooler): unnamed, not prepared.

export interface ListDeadLettersParams {
  /** Only this queue; null for every queue. */
  queue: string | null;
  /** Only this reason; null for every reason. */
  reason: string | null;
  limit: number;
}

/** Dead letters, most recently dead first. */
export function listDeadLettersStatement(names: OutboxNames): Query<ListDeadLettersParams, DeadLetterRow> {
  return defineQuery(
    "dead_list",
    `SELECT ${DEAD_LETTER_COLUMNS}
FROM ${names.deadLetters}
WHERE ($1::text IS NULL OR queue = $1::text) AND ($2::text IS NULL OR reason = $2::text)
ORDER BY dead_at DESC, id DESC
LIMIT $3::int`,
    (p) => [p.queue, p.reason, p.limit],
  );
}

/** The dead letter with this id (a decimal string), or no row. */
export function getDeadLetterStatement(names: OutboxNames): Query<{ id: string }, DeadLetterRow> {
  return defineQuery(
    "dead_get",
    `SELECT ${DEAD_LETTER_COLUMNS} FROM ${names.deadLetters} WHERE id = $1::bigint`,
    (p) => [p.id],
  );
}

/**
 * Per queue: rows moved back (or that would be), rows left in place because their id is taken, and rows
 * left for another try because a producer held their key's lock (`busy_ids`; never from a preview).
 */
export interface ReplayCountRow {
  queue: string;
  replayed: number;
  skipped: number;
  skipped_ids: string[];
  busy_ids: string[];
}

/** Which dead letters replay takes: every non-null field must match (all null: every dead letter). */
export interface ReplayParams {
  /** Decimal ids. */
  ids: string[] | null;
  queue: string | null;
  reason: string | null;
}

/** $1 ids, $2 queue, $3 reason (ReplayParams, in that order): every given filter must match. */
const replayValues = (p: ReplayParams): unknown[] => [p.ids, p.queue, p.reason];

const PICKED = `($1::bigint[] IS NULL OR d.id = ANY($1::bigint[]))
  AND ($2::text IS NULL OR d.queue = $2::text)
  AND ($3::text IS NULL OR d.reason = $3::text)`;
/** An event kept because no queue subscribed to its topic (migration 0012): its `queue` is the topic. */
const UNROUTED = `(d.reason = 'no_subscribers' AND d.headers ? 'outbox-topic')`;
const REPLAY_FILTER = `${PICKED} AND NOT ${UNROUTED}`;

/**
 * The dead letters the filter picks whose keys' locks are free, moved back into messages → ReplayCountRow
 * per queue. $4 is the wake channel of `names`.
 *
 * One statement, so it is one transaction on any executor, a pool included. A dead letter is deleted only
 * when its row was inserted: an id already in messages is skipped (ON CONFLICT) and stays a dead letter.
 * FOR UPDATE makes a concurrent replay of the same rows wait, then find them gone, rather than insert
 * them twice. The message keeps its id, key, headers and created_at; counters and attempt times start
 * over, and last_error keeps the reason it died so the next delivery is not a mystery. One wake-up per
 * queue that got rows, delivered at commit.
 *
 * Key locks are tried, never waited for: a plain-SQL producer's multi-row INSERT takes its keys' locks
 * in its own row order (the key-head trigger), so any order replay waited in could close a cycle with
 * it, and Postgres would abort one side (the producer's business transaction, maybe). A key whose lock is
 * busy keeps all its dead letters for the caller's next try (`busy_ids`), in a new transaction: replay
 * never waits for a key while holding another. Its rows' trigger takes the lock again, already held.
 */
export function replayDeadLettersStatement(names: OutboxNames): Query<ReplayParams, ReplayCountRow> {
  return defineQuery(
    "dead_replay",
    `WITH picked AS (
  -- In id order, so two replays over overlapping rows cannot deadlock on them. All of them are locked
  -- before any key is tried (the DISTINCT below reads them all), and these rows are no producer's.
  SELECT d.* FROM ${names.deadLetters} AS d
  WHERE ${REPLAY_FILTER}
  ORDER BY d.id
  FOR UPDATE
), keys AS MATERIALIZED (
  -- Each key tried once, in (queue, key) order; MATERIALIZED: once per key, however often it is read.
  SELECT k.queue, k.key, ${TRY_KEY_LOCK("k.queue", "k.key")} AS locked FROM (
    SELECT DISTINCT x.queue, x.key FROM picked AS x WHERE x.key IS NOT NULL ORDER BY 1, 2
  ) AS k
), movable AS (
  SELECT p.* FROM picked AS p
  WHERE p.key IS NULL OR EXISTS (SELECT 1 FROM keys AS k WHERE k.queue = p.queue AND k.key = p.key AND k.locked)
), inserted AS (
  INSERT INTO ${names.messages}
    (id, queue, payload, headers, key, created_at, available_at, deliveries_count, attempts_count,
     failures_count, last_error)
  OVERRIDING SYSTEM VALUE
  SELECT p.id, p.queue, p.payload, p.headers, p.key, p.created_at, now(), 0, 0, 0, p.error FROM movable AS p
  ORDER BY p.id
  ON CONFLICT (id) DO NOTHING
  RETURNING id
), removed AS (
  DELETE FROM ${names.deadLetters} AS d USING inserted AS i WHERE d.id = i.id
  RETURNING d.id
), outcome AS (
  SELECT p.queue, count(r.id)::int AS replayed,
         count(*) FILTER (WHERE r.id IS NULL AND v.id IS NOT NULL)::int AS skipped,
         COALESCE(array_agg(p.id::text ORDER BY p.id) FILTER (WHERE r.id IS NULL AND v.id IS NOT NULL), '{}') AS skipped_ids,
         COALESCE(array_agg(p.id::text ORDER BY p.id) FILTER (WHERE v.id IS NULL), '{}') AS busy_ids
  FROM picked AS p LEFT JOIN movable AS v ON v.id = p.id LEFT JOIN removed AS r ON r.id = p.id
  GROUP BY p.queue
)
SELECT o.queue, o.replayed, o.skipped, o.skipped_ids, o.busy_ids
FROM outcome AS o
CROSS JOIN LATERAL (SELECT CASE WHEN o.replayed > 0 THEN pg_notify($4::text, o.queue) END) AS wake
ORDER BY o.queue`,
    (p) => [...replayValues(p), names.channel],
  );
}

/** ReplayCountRow per queue, as replay would report it; changes nothing. */
export function previewReplayStatement(names: OutboxNames): Query<ReplayParams, ReplayCountRow> {
  return defineQuery(
    "dead_replay_preview",
    `SELECT d.queue, count(*) FILTER (WHERE m.id IS NULL)::int AS replayed, count(m.id)::int AS skipped,
       COALESCE(array_agg(d.id::text ORDER BY d.id) FILTER (WHERE m.id IS NOT NULL), '{}') AS skipped_ids,
       '{}'::text[] AS busy_ids
FROM ${names.deadLetters} AS d LEFT JOIN ${names.messages} AS m ON m.id = d.id
WHERE ${REPLAY_FILTER}
GROUP BY d.queue
ORDER BY d.queue`,
    replayValues,
  );
}

/**
 * The picked dead letters that were kept for want of a subscriber, fanned out to the queues subscribed to
 * their topic now (route_unrouted, migrations/functions/) → ReplayCountRow per topic: those still without a
 * subscriber stay, reported as skipped; those with subscribers that stayed found a key's lock busy
 * (route_unrouted tries them), reported in `busy_ids` for another try. One wake-up per queue that got a
 * copy. $4 is the wake channel.
 */
export function routeUnroutedDeadLettersStatement(names: OutboxNames): Query<ReplayParams, ReplayCountRow> {
  return defineQuery(
    "dead_route_unrouted",
    `WITH picked AS MATERIALIZED (
  SELECT d.id, d.queue, d.headers ->> 'outbox-topic' AS topic FROM ${names.deadLetters} AS d WHERE ${PICKED} AND ${UNROUTED}
), routed AS MATERIALIZED (
  SELECT r.dead_id, r.queue FROM ${names.quotedSchema}.route_unrouted(ARRAY(SELECT p.id FROM picked AS p)) AS r
), woken AS MATERIALIZED (
  SELECT count(pg_notify($4::text, q.queue)) AS n FROM (SELECT DISTINCT x.queue FROM routed AS x) AS q
)
SELECT p.queue, count(DISTINCT r.dead_id)::int AS replayed,
       count(DISTINCT p.id) FILTER (WHERE r.dead_id IS NULL AND s.n = 0)::int AS skipped,
       COALESCE(array_agg(DISTINCT p.id::text) FILTER (WHERE r.dead_id IS NULL AND s.n = 0), '{}') AS skipped_ids,
       COALESCE(array_agg(DISTINCT p.id::text) FILTER (WHERE r.dead_id IS NULL AND s.n > 0), '{}') AS busy_ids
FROM picked AS p LEFT JOIN routed AS r ON r.dead_id = p.id CROSS JOIN woken AS w
CROSS JOIN LATERAL (SELECT cardinality(${names.quotedSchema}.topic_queues(p.topic)) AS n) AS s
GROUP BY p.queue
ORDER BY p.queue`,
    (p) => [...replayValues(p), names.channel],
  );
}

/** routeUnroutedDeadLettersStatement's counts, as it would report them now; changes nothing. */
export function previewRouteUnroutedStatement(names: OutboxNames): Query<ReplayParams, ReplayCountRow> {
  return defineQuery(
    "dead_route_unrouted_preview",
    `SELECT d.queue, count(*) FILTER (WHERE s.n > 0)::int AS replayed, count(*) FILTER (WHERE s.n = 0)::int AS skipped,
       COALESCE(array_agg(d.id::text ORDER BY d.id) FILTER (WHERE s.n = 0), '{}') AS skipped_ids,
       '{}'::text[] AS busy_ids
FROM ${names.deadLetters} AS d
CROSS JOIN LATERAL (SELECT cardinality(${names.quotedSchema}.topic_queues(d.headers ->> 'outbox-topic')) AS n) AS s
WHERE ${PICKED} AND ${UNROUTED}
GROUP BY d.queue
ORDER BY d.queue`,
    replayValues,
  );
}

export interface PurgeCountRow {
  queue: string;
  purged: number;
}

export interface PurgeParams {
  /** Dead letters that died more than this long ago (server clock). */
  olderThanMs: number;
  /** Only this queue; null for every queue. */
  queue: string | null;
}

/** $1 olderThanMs, $2 queue (PurgeParams, in that order). */
const purgeValues = (p: PurgeParams): unknown[] => [p.olderThanMs, p.queue];

const PURGE_FILTER = `dead_at < now() - $1::double precision * interval '1 millisecond'
  AND ($2::text IS NULL OR queue = $2::text)`;

/** PurgeCountRow per queue of the rows deleted. */
export function purgeDeadLettersStatement(names: OutboxNames): Query<PurgeParams, PurgeCountRow> {
  return defineQuery(
    "dead_purge",
    `WITH gone AS (
  DELETE FROM ${names.deadLetters} WHERE ${PURGE_FILTER}
  RETURNING queue
)
SELECT queue, count(*)::int AS purged FROM gone GROUP BY queue ORDER BY queue`,
    purgeValues,
  );
}

/** PurgeCountRow per queue of the rows purge would delete. */
export function previewPurgeStatement(names: OutboxNames): Query<PurgeParams, PurgeCountRow> {
  return defineQuery(
    "dead_purge_preview",
    `SELECT queue, count(*)::int AS purged FROM ${names.deadLetters}
WHERE ${PURGE_FILTER}
GROUP BY queue ORDER BY queue`,
    purgeValues,
  );
}

/** Per queue: dead letters one retention batch deleted. */
export interface ExpireCountRow {
  queue: string;
  deleted: number;
}

export interface ExpireParams {
  /** Dead letters that died more than this long ago (server clock) go. */
  olderThanMs: number;
  /** Most rows one statement deletes: keeps each statement, and its locks, short. */
  limit: number;
}

/**
 * One retention batch: at most `limit` dead letters older than `olderThanMs`, oldest first (the dead_at
 * index gives them in order, so no scan of the whole table), deleted → ExpireCountRow per queue.
 *
 * SKIP LOCKED: a row a replay, a purge or another replica's batch holds is left for a later run rather
 * than waited for, so replicas running this at once never queue behind each other or behind a person.
 * Through expire_dead_letters (migrations/functions/), as the schema's owner: the worker's role holds no DELETE on
 * dead_letters, only the right to run this.
 */
export function expireDeadLettersStatement(names: OutboxNames): Query<ExpireParams, ExpireCountRow> {
  return defineQuery(
    "dead_expire",
    `SELECT queue, deleted FROM ${names.quotedSchema}.expire_dead_letters($1::double precision, $2::int)`,
    (p) => [p.olderThanMs, p.limit],
  );
}

/** The oldest dead letter left, of every queue. */
export interface OldestDeadLetterRow {
  /** Its dead_at; null when there are no dead letters. */
  dead_at: Date | null;
  /** Seconds since it died; null when there are no dead letters. */
  age_s: number | null;
}

/** The oldest dead letter's dead_at and age: one probe of the dead_at index. */
export function oldestDeadLetterStatement(names: OutboxNames): Query<NoParams, OldestDeadLetterRow> {
  return defineQuery(
    "dead_oldest",
    `SELECT min(dead_at) AS dead_at, extract(epoch FROM now() - min(dead_at))::float8 AS age_s
FROM ${names.deadLetters}`,
    () => [],
  );
}
