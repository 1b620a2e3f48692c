import { defineQuery, type Query } from "./executor.js";
import type { OutboxNames } from "./names.js";
import type { MessageColumns } from "./rows.js";
import { type StatementSettings, settingsCte } from "./settings.js";

/**
 * A leased row, as the fetch statement returns it: only what dispatch reads (every column costs per row).
 * `created_at` comes as epoch seconds: pg parses a float far faster than a timestamp string. The payload
 * comes as the stored JSON text, unparsed: relays forward it byte for byte (a number beyond 2^53 survives),
 * and it is parsed only for handlers that take a parsed payload.
 */
export type LeasedRow = Omit<MessageColumns, "available_at" | "created_at" | "payload"> & {
  created_epoch: number;
  payload: string;
};

/** What a lease returns of each row (the {@link LeasedRow} columns), from a row alias `t`. */
export const LEASED_COLUMNS = `t.id::text AS id, t.queue, t.payload::text AS payload, t.headers, t.key, date_part('epoch', t.created_at) AS created_epoch,
          t.deliveries_count, t.attempts_count, t.failures_count, t.first_attempt_at, t.last_attempt_at`;

export interface LeaseParams {
  queues: readonly string[];
  /** The subset of `queues` that opted out of per-key ordering: their rows waiting behind a key's head are due too. */
  unorderedQueues?: readonly string[];
  limit: number;
  /**
   * Stop before the payloads leased sum past this many bytes, as stored (`pg_column_size`: read from the
   * row, no detoasting; compressed payloads count their compressed size). The first row is always taken, so
   * one larger than the budget is still delivered. Unset: no byte bound.
   */
  maxBytes?: number;
  token: string;
  leaseTtlMs: number;
  workerId: string;
  /**
   * The most rows each queue's scan takes (in `queues` order; see QueueShares). Unset: `limit` each. The
   * statement still leases at most `limit` in all, oldest first among what the scans found.
   */
  shares?: readonly number[];
}

/**
 * Lease up to `limit` rows of `queues` whose lease is unset or expired and whose time has come, oldest
 * first within each queue, under `token` for `leaseTtlMs`, naming `workerId` as their holder.
 *
 * Several queues: each queue's scans stop at its `shares` entry (every row a scan takes is read and
 * locked, picked or not), and where the shares sum past the limit each queue gives up the same fraction
 * of its rows (its k-th row takes turn k / share), so one queue's backlog does not starve the others.
 *
 * Per-key ordering: only the head of a key (no earlier row of its queue and key left) is ready, and the
 * due index holds heads only, so a hot key's backlog is never walked; a batch holds at most one row per
 * key. Queues that opted out also take the rows waiting behind a head (their own index).
 *
 * Each queue's scan walks its due index (messages_due_idx) oldest first through LATERAL, so the cost
 * follows the batch size and the rows in flight, not the backlog: leases are taken oldest first, so the
 * live ones sit at the front of the range and are stepped over on the heap; an expired one is taken where
 * it stands, in order. SKIP LOCKED lets concurrent workers take disjoint rows without waiting on each
 * other. The picked ids come back as an array so the UPDATE finds them by primary key: joining the CTE
 * instead lets a generic plan choose a hash join over a full scan of the table.
 *
 * Bytes: the picked rows end at a running sum of their stored payload sizes (`maxBytes`), so one fetch of
 * 1 MB rows never asks the driver for 500 MB; reading the size is cheap, converting jsonb to text is not.
 */
export function fetchStatement(
  names: OutboxNames,
  settings: StatementSettings,
  /** Only ever one queue: no turns to take, oldest first (saves a sort and a window per fetch). */
  oneQueue = false,
): Query<LeaseParams, LeasedRow> {
  const m = names.messages;
  const cte = settingsCte(settings);
  return defineQuery(
    "lease",
    `WITH ${cte === "" ? "" : `${cte}, `}${pickedCtes(m, oneQueue, { queues: 1, limit: 2, unordered: 6, maxBytes: 7, shares: 8 })}
UPDATE ${m} AS t
SET acquired_token = $3::uuid,
    acquired_at = now(),
    lease_expires_at = now() + $4::double precision * interval '1 millisecond',
    acquired_by = $5,
    -- Saturated: a count at its limit must not fail the lease of every other row (it is dead-lettered).
    deliveries_count = LEAST(t.deliveries_count, 2147483646) + 1${cte === "" ? "" : "\nFROM settings"}
WHERE t.id = ANY (ARRAY(SELECT id FROM picked))
RETURNING ${LEASED_COLUMNS}`,
    (p) => [
      p.queues,
      p.limit,
      p.token,
      p.leaseTtlMs,
      p.workerId,
      p.unorderedQueues ?? [],
      p.maxBytes ?? Number.MAX_SAFE_INTEGER,
      p.shares ?? p.queues.map(() => p.limit),
    ],
  );
}

/** What a transaction-held lease reads: its rows, as a token lease would have counted them. */
export type HeldByTransactionRow = LeasedRow & {
  /** The row's lease token, when an expired lease still names it (else null): its writes are fenced by it. */
  lease_token: string | null;
  /** The leasing transaction, for the batch's guard row. */
  xid: string;
  /** The row version read (xmin): a row locked again must still be this one. */
  version: string;
  /** Rows the statement's scans locked, taken or not: more than it returned when its cut left some out. */
  locked: number;
};

/**
 * The lease of a transaction-held batch (leaseMode "transaction"): the same rows `fetchStatement` would
 * lease, locked FOR UPDATE by the caller's open transaction instead of written. The lock is the lease:
 * other workers' fetches skip the rows until that transaction ends, and a crash or a lost connection ends
 * it (the server rolls it back). `deliveries_count` reads as the token lease would have written it (+1);
 * the count is written only with a retry or a dead-letter move, or by the guard's repair after a crash.
 */
export function heldByTransactionStatement(
  names: OutboxNames,
  oneQueue = false,
): Query<Omit<LeaseParams, "token" | "leaseTtlMs" | "workerId">, HeldByTransactionRow> {
  const m = names.messages;
  return defineQuery(
    "lease_in_transaction",
    `WITH ${pickedCtes(m, oneQueue, { queues: 1, limit: 2, unordered: 3, maxBytes: 4, shares: 5 })}
SELECT ${LEASED_COLUMNS.replace("t.deliveries_count,", "LEAST(t.deliveries_count, 2147483646) + 1 AS deliveries_count,")},
       t.acquired_token::text AS lease_token, pg_current_xact_id()::text AS xid, t.xmin::text AS version,
       (SELECT count(*) FROM (SELECT id FROM due UNION ALL SELECT id FROM behind) AS l)::int AS locked
FROM ${m} AS t
WHERE t.id = ANY (ARRAY(SELECT id FROM picked))
ORDER BY t.id`,
    // Rows a scan locked but the cut left out (the byte budget, a queue's share) would stay locked until
    // the batch ends, out of every other worker's reach: the caller then releases them (`locked`).
    (p) => [
      p.queues,
      p.limit,
      p.unorderedQueues ?? [],
      p.maxBytes ?? Number.MAX_SAFE_INTEGER,
      p.shares ?? p.queues.map(() => p.limit),
    ],
  );
}

/** Where each of the ready-branch's inputs is among the statement's parameters. */
interface PickParams {
  queues: number;
  limit: number;
  unordered: number;
  maxBytes: number;
  shares: number;
}

/** The CTEs `due`, `behind` and `picked` (the ids to lease, locked FOR UPDATE SKIP LOCKED). */
function pickedCtes(m: string, oneQueue: boolean, $: PickParams): string {
  const turn = oneQueue
    ? "0"
    : "(row_number() OVER (PARTITION BY queue ORDER BY available_at, id))::float8 / share";
  // A row a fetch may lease: unleased. Checked on the heap: no index holds the lease columns, so a lease is
  // a HOT update (migration 0021). A row whose lease ran out was held through a crash (or a freeze): it is
  // leased only alone (aloneStatement), never in a batch, so that a crash loop's culprit is isolated.
  const due = "acquired_token IS NULL";
  return `due AS (
  SELECT c.id, c.available_at, c.bytes, q.queue, q.share FROM unnest($${$.queues}::text[], $${$.shares}::int[]) AS q(queue, share)
  CROSS JOIN LATERAL (
    SELECT id, available_at, pg_column_size(payload) AS bytes FROM ${m}
    WHERE queue = q.queue AND head AND available_at <= now() AND ${due}
    ORDER BY available_at, id
    -- Its share, not the whole limit: every row a scan takes is read and locked, picked or not.
    LIMIT q.share
    FOR UPDATE SKIP LOCKED
  ) AS c
), behind AS (
  SELECT c.id, c.available_at, c.bytes, q.queue, q.share FROM unnest($${$.queues}::text[], $${$.shares}::int[]) AS q(queue, share)
  CROSS JOIN LATERAL (
    SELECT id, available_at, pg_column_size(payload) AS bytes FROM ${m}
    WHERE queue = q.queue AND NOT head AND available_at <= now() AND ${due}
    ORDER BY available_at, id
    LIMIT q.share
    FOR UPDATE SKIP LOCKED
  ) AS c
  WHERE q.queue = ANY ($${$.unordered}::text[])
), picked AS (
  SELECT id FROM (
    SELECT id, row_number() OVER w AS n, sum(bytes) OVER w AS running
    FROM (
      -- A queue's k-th row (oldest first) takes turn k / share: where the shares sum past the limit, the
      -- cut takes the same fraction of each queue's rows, not the oldest of all (one queue's old backlog
      -- would starve the others). With one queue this is oldest first.
      SELECT id, available_at, bytes, ${turn} AS turn
      FROM (SELECT * FROM due UNION ALL SELECT * FROM behind) AS r
    ) AS candidates
    WINDOW w AS (ORDER BY turn, available_at, id ROWS UNBOUNDED PRECEDING)
    ORDER BY turn, available_at, id
    LIMIT $${$.limit}
  ) AS sized
  WHERE n = 1 OR running <= $${$.maxBytes}::bigint
)`;
}

/**
 * How far the look for rows held through a crash walks each queue's due rows, oldest first. Leases are taken
 * oldest first, so a lease that ran out sits at the front, before the rows other workers hold and those
 * waiting: the walk stays short however long the backlog (one deeper is found once the backlog shrinks).
 */
export const SUSPECT_WALK = 2000;

/** Parameters of the statements that look for a row held through a crash. */
export interface AloneParams {
  queues: readonly string[];
  unorderedQueues?: readonly string[];
  /** Tokens whose expired leases are not taken: the caller still runs those deliveries (a blocked loop). */
  keep?: readonly string[];
}

/**
 * The CTE `suspects`: a few rows of `queues` whose lease ran out (held by a delivery that ended without an
 * outcome: its worker crashed, froze, or lost the lease), oldest first, not under a `keep` token. Each
 * queue's heads are walked on the due index (and the rows behind them, for unordered queues), at most
 * SUSPECT_WALK of them: bounded whatever the backlog.
 */
function suspectsCte(m: string, $: { queues: number; unordered: number; keep: number }): string {
  const walk = (index: string, extra: string) => `SELECT w.id, w.available_at FROM (
      SELECT id, available_at, acquired_token, lease_expires_at FROM ${m}
      WHERE queue = q.queue AND ${index} AND available_at <= now()${extra}
      ORDER BY available_at, id LIMIT ${SUSPECT_WALK}
    ) AS w
    WHERE w.acquired_token IS NOT NULL AND w.lease_expires_at <= now() AND w.acquired_token <> ALL ($${$.keep}::uuid[])`;
  return `suspects AS (
  SELECT c.id, c.available_at FROM unnest($${$.queues}::text[]) AS q(queue)
  CROSS JOIN LATERAL (
    (${walk("head", "")} ORDER BY w.available_at, w.id LIMIT 3)
    UNION ALL
    (${walk("NOT head", ` AND q.queue = ANY ($${$.unordered}::text[])`)} ORDER BY w.available_at, w.id LIMIT 3)
  ) AS c
)`;
}

/** The oldest suspect that is still one when locked (SKIP LOCKED: another worker may be taking it). */
function aloneCte(m: string, keep: number): string {
  return `alone AS (
  SELECT t.id FROM ${m} AS t
  WHERE t.id = ANY (ARRAY(SELECT id FROM suspects))
    AND t.acquired_token IS NOT NULL AND t.lease_expires_at <= now() AND t.acquired_token <> ALL ($${keep}::uuid[])
  ORDER BY t.available_at, t.id LIMIT 1
  FOR UPDATE SKIP LOCKED
)`;
}

/**
 * Lease one row held through a crash, alone (the caller holds nothing else and starts nothing else until
 * its outcome lands): if it crashes its worker again, it alone is charged the delivery, and the rows the
 * crashed batch held beside it run alone too, never charged for the culprit. As `fetchStatement`, it counts
 * the delivery; no row, when none is waiting.
 */
export function aloneStatement(
  names: OutboxNames,
  settings: StatementSettings,
): Query<AloneParams & { token: string; leaseTtlMs: number; workerId: string }, LeasedRow> {
  const m = names.messages;
  const cte = settingsCte(settings);
  return defineQuery(
    "lease_alone",
    `WITH ${cte === "" ? "" : `${cte}, `}${suspectsCte(m, { queues: 1, unordered: 2, keep: 3 })}, ${aloneCte(m, 3)}
UPDATE ${m} AS t
SET acquired_token = $4::uuid,
    acquired_at = now(),
    lease_expires_at = now() + $5::double precision * interval '1 millisecond',
    acquired_by = $6,
    deliveries_count = LEAST(t.deliveries_count, 2147483646) + 1${cte === "" ? "" : "\nFROM settings"}
WHERE t.id = (SELECT id FROM alone)
RETURNING ${LEASED_COLUMNS}`,
    (p) => [p.queues, p.unorderedQueues ?? [], p.keep ?? [], p.token, p.leaseTtlMs, p.workerId],
  );
}

/** `aloneStatement` for a transaction-held batch: the row locked, not written (see heldByTransactionStatement). */
export function heldAloneStatement(names: OutboxNames): Query<AloneParams, HeldByTransactionRow> {
  const m = names.messages;
  return defineQuery(
    "lease_alone_in_transaction",
    `WITH ${suspectsCte(m, { queues: 1, unordered: 2, keep: 3 })}, ${aloneCte(m, 3)}
SELECT ${LEASED_COLUMNS.replace("t.deliveries_count,", "LEAST(t.deliveries_count, 2147483646) + 1 AS deliveries_count,")},
       t.acquired_token::text AS lease_token, pg_current_xact_id()::text AS xid, t.xmin::text AS version,
       1 AS locked
FROM ${m} AS t
WHERE t.id = (SELECT id FROM alone)`,
    (p) => [p.queues, p.unorderedQueues ?? [], p.keep ?? []],
  );
}

/** Whether a row held through a crash waits in `queues` (reads only: no lock, no lease). */
export function suspectsWaitingStatement(names: OutboxNames): Query<AloneParams, { waiting: boolean }> {
  return defineQuery(
    "suspects_waiting",
    `WITH ${suspectsCte(names.messages, { queues: 1, unordered: 2, keep: 3 })}
SELECT EXISTS (SELECT 1 FROM suspects) AS waiting`,
    (p) => [p.queues, p.unorderedQueues ?? [], p.keep ?? []],
  );
}
