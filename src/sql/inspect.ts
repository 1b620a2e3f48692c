import { defineQuery, type NoParams, type Query } from "./executor.js";
import { type OutboxNames, quoteLiteral } from "./names.js";

// Run rarely, on executors the caller hands in (maybe behind a pooler): unnamed, not prepared.

/** One queue's counts by state, as `status` prints them and the metrics gauges export them. */
export interface QueueStatusRow {
  queue: string;
  /** Due and not leased: waiting for a worker. */
  ready: number;
  /**
   * Waiting behind an earlier message of their key (per-key ordering): they become ready when it is acked
   * or dead-lettered. On a queue that opted out (`ordered: false`), its workers take them as ready.
   */
  blocked: number;
  /** Not due yet (`delayMs`, `availableAt` or a retry's backoff). */
  scheduled: number;
  /** Held by a worker under a live lease, or by a transaction-held batch. */
  leased: number;
  /** Leased, but the lease ran out: they will be fetched again. */
  expired: number;
  /** Rows in dead_letters. */
  dead: number;
  /** Seconds since the oldest ready row became deliverable (its available_at); null when none is ready. */
  oldest_ready_age_s: number | null;
  /**
   * Seconds since the queue's oldest dead letter died; null when it has none. With a dead-letter retention
   * on, it stays below the retention (plus a run's cadence): above it, the retention job is not keeping up.
   */
  oldest_dead_age_s: number | null;
}

/**
 * Per-queue counts by state, plus dead letters. A plain aggregate: it takes no row lock and no lease, so
 * it never slows the worker beyond the read itself. A lease is told by acquired_at (null exactly when the
 * token is: messages_lease_complete), so an inspector reads no token. It scans the backlog, so it is run every few seconds,
 * not per message.
 */
export function queueStatusStatement(names: OutboxNames): Query<NoParams, QueueStatusRow> {
  return defineQuery(
    "queue_status",
    `WITH m AS (
  SELECT queue,
         count(*) FILTER (WHERE acquired_at IS NULL AND NOT batched AND head AND available_at <= now())::int AS ready,
         count(*) FILTER (WHERE acquired_at IS NULL AND NOT batched AND NOT head)::int AS blocked,
         count(*) FILTER (WHERE acquired_at IS NULL AND NOT batched AND head AND available_at > now())::int AS scheduled,
         count(*) FILTER (WHERE batched OR (acquired_at IS NOT NULL AND lease_expires_at > now()))::int AS leased,
         count(*) FILTER (WHERE acquired_at IS NOT NULL AND lease_expires_at <= now())::int AS expired,
         extract(epoch FROM now() - min(available_at)
                 FILTER (WHERE acquired_at IS NULL AND NOT batched AND head AND available_at <= now()))::float8 AS oldest_ready_age_s
  FROM (
    -- A transaction-held batch's rows carry no lease: their batch's live guard says they are held. A
    -- hashed set of the few rows held, probed per row: a join would be planned as a merge along the
    -- primary key, about twice as slow on a large backlog.
    SELECT t.queue, t.head, t.available_at, t.acquired_at, t.lease_expires_at,
           t.id IN (SELECT b.id FROM ${names.batchLeased} AS b) AS batched
    FROM ${names.messages} AS t
  ) AS r
  GROUP BY queue
), d AS (
  SELECT queue, count(*)::int AS dead, extract(epoch FROM now() - min(dead_at))::float8 AS oldest_dead_age_s
  FROM ${names.deadLetters} GROUP BY queue
)
SELECT COALESCE(m.queue, d.queue) AS queue,
       COALESCE(m.ready, 0) AS ready, COALESCE(m.blocked, 0) AS blocked, COALESCE(m.scheduled, 0) AS scheduled,
       COALESCE(m.leased, 0) AS leased, COALESCE(m.expired, 0) AS expired,
       COALESCE(d.dead, 0) AS dead, m.oldest_ready_age_s, d.oldest_dead_age_s
FROM m FULL JOIN d ON d.queue = m.queue
ORDER BY 1`,
    () => [],
  );
}

/** A queue whose oldest ready message is older than asked, and whether any worker holds a lease on it. */
export interface StaleQueueRow {
  queue: string;
  /** Seconds since its oldest ready message became deliverable (its available_at). */
  oldest_ready_age_s: number;
  /** Some row of the queue is under a live lease: a worker takes from it. */
  leased: boolean;
}

export interface StaleQueuesParams {
  /** Queues whose oldest ready message became deliverable longer ago than this. */
  olderThanMs: number;
}

/** How many of a queue's oldest rows the lease check reads at most. */
const LEASE_CHECK_ROWS = 1000;

/**
 * The queues whose oldest ready message has waited longer than `olderThanMs`, each with whether a live
 * lease shows a worker taking from it. Index lookups only, a few per queue with ready rows: the queues
 * are walked through the due index (a skip scan, one probe per queue), each one's oldest ready row is the
 * first unleased entry of its range there, and the lease check reads the first LEASE_CHECK_ROWS entries.
 * Workers lease oldest first, so a worker's leases sit in front of the oldest row it has not taken: the
 * first read steps over the rows in flight only, and the check finds a live lease among them. The rows of
 * transaction-held batches (no lease on the row) are found from their guards: a few small rows, a
 * primary-key look-up per row named. It never counts the backlog, so it costs the same at 10 rows or 10 million.
 */
export function staleQueuesStatement(names: OutboxNames): Query<StaleQueuesParams, StaleQueueRow> {
  return defineQuery(
    "stale_queues",
    `WITH RECURSIVE queues(queue) AS (
  (SELECT queue FROM ${names.messages} WHERE head ORDER BY queue LIMIT 1)
  UNION ALL
  SELECT (SELECT m.queue FROM ${names.messages} AS m WHERE m.head AND m.queue > q.queue ORDER BY m.queue LIMIT 1)
  FROM queues AS q WHERE q.queue IS NOT NULL
)
SELECT q.queue, extract(epoch FROM now() - r.available_at)::float8 AS oldest_ready_age_s,
       -- The queue's oldest rows in index order, up to a bound: a bound on the range instead (rows ahead of
       -- r) is planned as a bitmap scan of a third of the queue, a guess the planner cannot do better.
       COALESCE((SELECT bool_or(f.acquired_token IS NOT NULL AND f.lease_expires_at > now())
                 FROM (SELECT l.acquired_token, l.lease_expires_at FROM ${names.messages} AS l
                       WHERE l.queue = q.queue AND l.head
                       ORDER BY l.available_at, l.id LIMIT ${LEASE_CHECK_ROWS}) AS f), false)
       -- Transaction-held batches write no lease: a live guard naming a row of the queue is its worker.
       OR EXISTS (SELECT 1 FROM ${names.batchLeased} AS b JOIN ${names.messages} AS x ON x.id = b.id
                  WHERE x.queue = q.queue) AS leased
FROM queues AS q
CROSS JOIN LATERAL (
  SELECT m.available_at FROM ${names.messages} AS m
  WHERE m.queue = q.queue AND m.acquired_token IS NULL AND m.head
  ORDER BY m.available_at, m.id LIMIT 1
) AS r
WHERE q.queue IS NOT NULL AND r.available_at <= now() - make_interval(secs => $1::float8 / 1000)
ORDER BY 1`,
    (p) => [p.olderThanMs],
  );
}

/** The messages table's vacuum state and size: what vacuum has left to do, and whether it will. */
export interface TableHealthRow {
  /** Dead row versions not vacuumed yet (every message leaves about two). */
  dead_tuples: number;
  /** Live rows (an estimate from the statistics). */
  live_tuples: number;
  /** Heap, indexes and TOAST. */
  total_bytes: number;
  last_autovacuum: Date | null;
  last_vacuum: Date | null;
  /** Server-wide `autovacuum` on and not switched off for this table. */
  autovacuum_enabled: boolean;
  /** Row updates since the statistics were reset (leases, renewals, retries, promotions). */
  updates: number;
  /** Of those, HOT updates: no index entry written (every lease, where the page has room; migration 0021). */
  hot_updates: number;
}

/**
 * One row from the cumulative statistics (a few hundred ms behind) and the catalog: reads nothing of the
 * table itself, so it is cheap at any size.
 */
export function tableHealthStatement(names: OutboxNames): Query<NoParams, TableHealthRow> {
  const table = quoteLiteral(names.messages);
  return defineQuery(
    "table_health",
    `SELECT COALESCE(s.n_dead_tup, 0)::float8 AS dead_tuples, COALESCE(s.n_live_tup, 0)::float8 AS live_tuples,
       COALESCE(s.n_tup_upd, 0)::float8 AS updates, COALESCE(s.n_tup_hot_upd, 0)::float8 AS hot_updates,
       pg_total_relation_size(c.oid)::float8 AS total_bytes, s.last_autovacuum, s.last_vacuum,
       current_setting('autovacuum') = 'on'
         AND NOT COALESCE('autovacuum_enabled=false' = ANY (c.reloptions), false) AS autovacuum_enabled
FROM pg_class AS c LEFT JOIN pg_stat_all_tables AS s ON s.relid = c.oid
WHERE c.oid = to_regclass(${table})`,
    () => [],
  );
}

/** The leases one worker holds, as `status` prints them. */
export interface WorkerLeasesRow {
  /** `acquired_by`: the worker's id (its host name by default). */
  worker: string;
  /** Rows it holds a lease on (live or expired). */
  held: number;
  /** Of those, leases that ran out without an outcome: a stalled or dead worker. */
  expired: number;
  /** Seconds since its oldest lease was taken. */
  oldest_lease_age_s: number;
}

/**
 * Per worker: rows leased (transaction-held batches too, never expired), expired leases, oldest lease.
 * Through the `leases` view (migration 0015: no token for whoever reads it). No index holds the lease
 * columns (leases are HOT updates, migration 0021), so this reads the table: a status command's read, like
 * the per-queue counts.
 */
export function workerLeasesStatement(names: OutboxNames): Query<NoParams, WorkerLeasesRow> {
  return defineQuery(
    "worker_leases",
    `SELECT COALESCE(acquired_by, '?') AS worker, count(*)::int AS held,
       count(*) FILTER (WHERE lease_expires_at <= now())::int AS expired,
       extract(epoch FROM now() - min(acquired_at))::float8 AS oldest_lease_age_s
FROM ${names.leases}
GROUP BY 1
ORDER BY 1`,
    () => [],
  );
}

export interface BacklogRow {
  /** Rows in messages: every message not delivered yet, in any state. */
  n: number;
}

/** The number of rows in messages (a full count: for small tables and the demo, not for dashboards). */
export function backlogStatement(names: OutboxNames): Query<NoParams, BacklogRow> {
  return defineQuery("backlog", `SELECT count(*)::int AS n FROM ${names.messages}`, () => []);
}

/** Whether there is a subscriptions table, and whether this role may read it (a plain worker role may not). */
export interface SubscriptionsAccessRow {
  /** False on a schema before migration 0012: no subscription can exist. */
  present: boolean;
  /** SELECT on its pattern and queue columns. */
  readable: boolean;
}

/**
 * Asked first, so a role without the right gets "not shown" instead of an error (which would also abort a
 * caller's transaction): Postgres checks table rights before it runs a statement, whatever its WHERE says.
 */
export function subscriptionsAccessStatement(names: OutboxNames): Query<NoParams, SubscriptionsAccessRow> {
  const table = quoteLiteral(names.subscriptions);
  return defineQuery(
    "subscriptions_access",
    `SELECT t.oid IS NOT NULL AS present,
       COALESCE(has_column_privilege(t.oid, 'pattern', 'SELECT') AND has_column_privilege(t.oid, 'queue', 'SELECT'),
                false) AS readable
FROM (SELECT to_regclass(${table}) AS oid) AS t`,
    () => [],
  );
}

/** One topic pattern and the queues subscribed to it. */
export interface TopicSubscribersRow {
  /** A topic name or pattern (`order.placed`, `order.*`, `order.#`). */
  pattern: string;
  /** The queues that receive a copy of each event it matches, in name order. */
  queues: string[];
}

/**
 * Every subscription, grouped by pattern. The table is what operators declare (a row per pattern and
 * queue), so it is small; read through its primary key's order.
 */
export function topicSubscribersStatement(names: OutboxNames): Query<NoParams, TopicSubscribersRow> {
  return defineQuery(
    "topic_subscribers",
    `SELECT pattern, array_agg(queue ORDER BY queue) AS queues
FROM ${names.subscriptions}
GROUP BY pattern
ORDER BY pattern`,
    () => [],
  );
}

/** Events of one topic kept as dead letters `no_subscribers` (their `queue` column is the topic). */
export interface UnroutedTopicRow {
  topic: string;
  /** Events kept. */
  events: number;
  /** Seconds since the oldest of them was kept. */
  oldest_age_s: number;
  /** Topics with kept events, all of them (the rows stop at the limit). */
  topics: number;
  /** Kept events, all topics together. */
  total: number;
}

/**
 * Per topic, the events published while no queue subscribed to it, most first, at most $1 topics (a
 * producer names topics, and a mistake could make many), each row carrying the totals over all topics.
 * A plain aggregate over dead_letters like queue_status's: no row lock, no lease.
 */
export function unroutedTopicsStatement(names: OutboxNames): Query<{ limit: number }, UnroutedTopicRow> {
  return defineQuery(
    "unrouted_topics",
    `WITH t AS (
  SELECT queue AS topic, count(*)::int AS events, min(dead_at) AS oldest
  FROM ${names.deadLetters}
  WHERE reason = 'no_subscribers'
  GROUP BY queue
)
SELECT topic, events, extract(epoch FROM now() - oldest)::float8 AS oldest_age_s,
       (count(*) OVER ())::int AS topics, (sum(events) OVER ())::int AS total
FROM t
ORDER BY events DESC, topic
LIMIT $1::int`,
    (p) => [p.limit],
  );
}
