import { defineQuery, type Query } from "./executor.js";
import type { LeasedRow } from "./fetch.js";
import { ACK_TURN, ACK_TURN_ID, KEY_LOCK, TRY_KEY_LOCK, TURN_LIMIT } from "./key-lock.js";
import type { OutboxNames } from "./names.js";
import { type StatementSettings, settingsJoin, withSettings } from "./settings.js";

/**
 * The writes that end or extend a lease. Every one takes parallel arrays of (id, token) and touches a row
 * only while it still carries that token: a worker whose lease was taken over writes 0 rows, so the newer
 * owner always wins. Rows missing from RETURNING are the caller's `lease_lost`.
 *
 * What comes back names deliveries, not rows: `id/token` keys (see `deliveryKey`). One worker can hold two
 * deliveries of the same row at once (its own lease expired while the handler ran, and it leased the row
 * again): an answer by id alone would credit the old delivery with the new one's write.
 *
 * The pairs are joined through unnest, each id looked up by primary key. Taking, renewing and clearing a
 * lease change no indexed column (migration 0021), so those writes are HOT updates: a new row version on the
 * same page, no index entry.
 */
/** Parallel arrays naming deliveries: `ids[i]` leased under `tokens[i]`, as array literals or arrays. */
export interface DeliveryParams {
  ids: string | readonly string[];
  tokens: string | readonly string[];
}

/**
 * The token of deliveries no lease names: rows locked by the transaction that leased them (leaseMode
 * "transaction"). The fence reads an unleased row's token as this one; a random (v4) token never is.
 */
export const UNLEASED_TOKEN = "00000000-0000-0000-0000-000000000000";

export interface CompleteStatements {
  /**
   * One row: `deleted` count, and `keys` (the deleted deliveries) only when some were not deleted. The
   * common case (every row still ours) returns no per-row data: at tens of thousands of acks a second, a
   * result row per message costs the worker more than the DELETE costs Postgres.
   */
  ack: Query<DeliveryParams, AckRow>;
  /**
   * The ack for deliveries that may head a key, run inside a transaction: it tries each head's key lock
   * first and leaves rows whose key a producer holds (`busy`, retried shortly); `heads` names the keys whose
   * head it deleted, for `promote` to run next in the same transaction.
   */
  ackKeyed: Query<DeliveryParams & Omit<PromoteParams, "queues" | "keys">, AckKeyedRow>;
  /**
   * `ackKeyed` for deliveries of ordered queues whose queue and key the caller passes (as leased), as array
   * literals (`textArray`): the key locks are tried on those, so each row is read once, by its delete.
   * Same answer.
   */
  ackKeyHeads: Query<
    DeliveryParams & { queues: string; keys: string } & Omit<PromoteParams, "queues" | "keys">,
    AckKeyedRow
  >;
  /**
   * The dead-letter move for deliveries that may head a key: as `dead`, trying each head's key lock (a
   * busy head stays); `heads` names the keys whose head went, for `promote` in the same transaction.
   */
  deadKeyed: Query<DeadParams, KeyedRow>;
  /**
   * After a keyed ack or dead-letter move, in its transaction (holding the key locks, so no producer of the
   * key is in flight, and a fresh snapshot that sees every committed row): the oldest row left of each key
   * becomes its head. Up to `limit` of them that are due are leased at once to the caller (a hand-off):
   * one write instead of a promotion and a later lease, and the key's next message starts without a fetch.
   */
  promote: Query<PromoteParams, PromotedRow>;
  /**
   * The ack of keyless deliveries with follow-ups, in ONE statement: the token-guarded delete, and the
   * insert of each follow-up whose parent that delete returned (a parent taken over inserts nothing).
   * Answers like `ack`, plus the number of follow-ups inserted.
   */
  ackFollowUps: Query<DeliveryParams & FollowUpParams, AckRow & { inserted: number }>;
  /**
   * `ackFollowUps` for deliveries with keyed follow-ups: the ack's turns on their keys waited for (another
   * such ack sharing keys goes first), then every follow-up key's lock tried, and only the parents whose
   * follow-up keys were all taken deleted (their follow-ups inserted); the others are named `busy` (a
   * producer of one of their keys is in flight) and tried again shortly.
   */
  ackFollowUpKeys: Query<FollowUpKeyParams, AckRow & { busy: string[]; inserted: number }>;
  /**
   * `ackFollowUpKeys` for deliveries that may head a key, in ONE statement (the follow-up keys are held for
   * one statement, not a transaction's round trips): turns and follow-up keys first; the deliveries whose
   * follow-up keys were all taken go through `ack_keyed` (heads' key locks tried, successors promoted and
   * handed off), then the follow-ups of those it deleted are inserted. Answers as `ackKeyed`, the
   * deliveries with a busy follow-up key among the `busy` ones.
   */
  ackKeyedFollowUps: Query<KeyedFollowUpParams, AckKeyedRow>;
  /** `ackKeyedFollowUps` through `ack_key_heads`: the parents' queues and keys as passed (`textArray`). */
  ackKeyHeadsFollowUps: Query<
    KeyedFollowUpParams & { parentQueues: string; parentKeys: string },
    AckKeyedRow
  >;
  /** Clears the lease and schedules the row on the server clock → keys of the rows written. */
  retry: Query<
    DeliveryParams & { delaysMs: number[]; errors: string[]; failed: number[]; maxErrorLength: number },
    KeyRow
  >;
  /**
   * The dead-letter move of keyless deliveries: one statement, the row leaves messages only if it lands in
   * dead_letters; answers as `deadKeyed` (no delivery is ever busy, no head removed).
   */
  dead: Query<DeadParams, KeyedRow>;
  /**
   * `dead` (or `deadKeyed`: same answer, same key locks) for a batch some of whose queues announce their
   * failures: the same move, and in the same statement a failure event for each delivery it moved whose
   * `announceQueues[i]` or `announceTopics[i]` is set (`dead_letter_announced`,
   * migrations/functions/dead_letter_announced.sql).
   */
  deadAnnounced: Query<DeadParams & AnnounceParams, KeyedRow>;
  /** Gives unstarted rows back (graceful stop) without counting a delivery → keys. */
  release: Query<DeliveryParams, KeyRow>;
  /** → keys of the leases still held, extended by `leaseTtlMs` from now. */
  renew: Query<DeliveryParams & { leaseTtlMs: number }, KeyRow>;
  /** → each delivery's row fate, in input order: a read after a write whose answer was lost. */
  whereabouts: Query<DeliveryParams, { fate: "held" | "unleased" | "taken" | "dead" | "gone" }>;
}

/**
 * Follow-up messages as parallel arrays, in insert order: `parents[i]` is the id of the delivery whose ack
 * carries follow-up i. Payloads and headers are JSON text; `wake` names the queues to notify in the
 * statement (the caller's throttle decides), on `channel`.
 */
export interface FollowUpParams {
  parents: string[];
  queues: string[];
  payloads: string[];
  headers: string[];
  keys: (string | null)[];
  availableAt: (Date | null)[];
  delaysMs: (number | null)[];
  channel: string;
  wake: string[];
}

/**
 * The ack of deliveries with keyed follow-ups: the follow-ups, and how long the statement may wait for a
 * lock (its turns first: the server gives up before the caller's query timeout, error 55P03).
 */
export type FollowUpKeyParams = DeliveryParams & FollowUpParams & { turnTimeoutMs: number };

export type KeyedFollowUpParams = FollowUpKeyParams & Omit<PromoteParams, "queues" | "keys">;

export type DeadParams = DeliveryParams & {
  reasons: string[];
  errors: (string | null)[];
  attempted: number[];
  failed: number[];
  maxErrorLength: number;
};

/**
 * Where each delivery's failure is announced, parallel to its ids: a queue, or a topic (fanned out to its
 * subscribers), or neither (null, null); `channel` wakes the queues that got an event.
 */
export interface AnnounceParams {
  announceQueues: (string | null)[];
  announceTopics: (string | null)[];
  channel: string;
}

export interface PromoteParams {
  queues: string[];
  keys: string[];
  /** How many of the new heads to lease to the caller (0: none), under `token`. */
  limit: number;
  token: string;
  leaseTtlMs: number;
  workerId: string;
}

/** A new head; `taken`: leased to the caller, with its {@link LeasedRow} columns. */
export type PromotedRow = LeasedRow & { taken: boolean };

/**
 * A row of the keyed ack (the `ack_keyed` and `ack_key_heads` functions, migrations/functions/):
 * `deleted` (the count, as text), `written` deliveries (only when some were not), `busy` ones (a producer
 * holds their key's lock), and `promoted` new heads (`taken`: handed off to the caller, with the
 * {@link LeasedRow} columns).
 */
export type AckKeyedRow =
  | { kind: "deleted" | "written" | "busy"; delivery: string }
  | ({ kind: "promoted"; delivery: null } & PromotedRow);

/** The one row of a keyed dead-letter move (the keyed ack answers with `AckKeyedRow`s). */
export interface KeyedRow {
  /** The deliveries written; null when all were (none busy, none lost). */
  keys: string[] | null;
  /** Deliveries left in place because a producer holds their key's lock: try again shortly. */
  busy: string[];
  /** Queue and key of each head removed: `promote` names their successors. */
  head_queues: string[];
  head_keys: string[];
}

/** A delivery's key: the row id and the lease token it was delivered under. */
export function deliveryKey(id: string, token: string): string {
  return `${id}/${token}`;
}

/**
 * The token a row's writes are fenced by: its lease's, or UNLEASED_TOKEN when no lease names it (a delivery
 * held by its leasing transaction's row lock, src/lease/pg-batch.ts).
 */
const TOKEN = `COALESCE(t.acquired_token, '${UNLEASED_TOKEN}'::uuid)`;
/** The same key, built in SQL from a row alias `t` that still carries its token. */
const KEY = `t.id::text || '/' || ${TOKEN}::text`;

export interface KeyRow {
  key: string;
}

/** The ack statement's one row. */
export interface AckRow {
  deleted: number;
  /** Null when every row was deleted. */
  keys: string[] | null;
}

/** Built once per schema and setting: a transaction-held batch makes a store of its own per batch. */
const built = new Map<string, CompleteStatements>();

export function completeStatements(names: OutboxNames, settings: StatementSettings): CompleteStatements {
  const id = `${names.quotedSchema}/${settings.synchronousCommit}`;
  let statements = built.get(id);
  if (!statements) {
    statements = buildCompleteStatements(names, settings);
    built.set(id, statements);
  }
  return statements;
}

function buildCompleteStatements(names: OutboxNames, settings: StatementSettings): CompleteStatements {
  const m = names.messages;
  const pairs = "unnest($1::bigint[], $2::uuid[])";
  const also = settingsJoin(settings);
  const deadValues = (p: DeadParams) => [
    p.ids,
    p.tokens,
    p.reasons,
    p.errors,
    p.attempted,
    p.failed,
    p.maxErrorLength,
    settings.synchronousCommit,
  ];
  // The move runs as the schema's owner (migration 0015): the worker's role may not write dead letters
  // itself, so it can never choose what one holds, only which of its own deliveries dies and why.
  const deadLetter = `SELECT * FROM ${names.quotedSchema}.dead_letter($1::bigint[], $2::uuid[], $3::text[], $4::text[], $5::int[], $6::int[], $7::int, $8::boolean)`;
  // Follow-ups go in like a publishMany: every key's lock taken first, in key order (no deadlock between two
  // such inserts), then the ids, so a keyed follow-up gets its id in commit order behind any producer of
  // its key; the key-head trigger marks whether it heads its key. `parents` restricts the rows to those
  // whose parent ack matched: the guarantee that a follow-up never exists without its parent's delete.
  const followUpRows = (parents: string, at: number) => `f AS MATERIALIZED (
  SELECT f.* FROM unnest($${at}::bigint[], $${at + 1}::text[], $${at + 2}::text[], $${at + 3}::text[],
                         $${at + 4}::text[], $${at + 5}::timestamptz[], $${at + 6}::double precision[]) WITH ORDINALITY
    AS f(parent_id, queue, payload, headers, key, available_at, delay_ms, ord)
  ${parents}
), inserted AS (
  INSERT INTO ${m} (queue, payload, headers, key, available_at)
  SELECT f.queue, f.payload::jsonb, f.headers::jsonb, f.key,
         COALESCE(f.available_at, now() + COALESCE(f.delay_ms, 0) * interval '1 millisecond')
  FROM f CROSS JOIN (
    SELECT count(*) FROM (
      SELECT ${KEY_LOCK("k.queue", "k.key")} FROM (
        SELECT DISTINCT f.queue, f.key FROM f WHERE f.key IS NOT NULL ORDER BY 1, 2
      ) AS k
    ) AS taken
  ) AS key_locks
  ORDER BY f.ord
  RETURNING queue
), wake AS (
  -- Wakes other workers like a publish does, only for queues that got a row (and the throttle allowed).
  SELECT count(pg_notify($${at + 7}::text, q.queue)) AS sent
  FROM unnest($${at + 8}::text[]) AS q(queue) WHERE q.queue IN (SELECT i.queue FROM inserted AS i)
)`;
  // An ack with keyed follow-ups first waits for its turns (ACK_TURN, its lowest TURN_LIMIT), bounded by
  // lock_timeout: only such acks take turns, in id order, before any other lock of their statement, so two
  // of them sharing keys queue instead of refusing each other. Then each key's lock is only tried: a producer may hold it, and
  // waiting could deadlock with one taking several keys in its own order. The aggregates read every row:
  // every key is tried before any parent is deleted, so the insert's own key locks never wait.
  // `blocked`: the parents with a busy key, which stay.
  const followUpKeyTries = (at: { parents: number; queues: number; keys: number; timeout: number }) => {
    const followUpKeys = `unnest($${at.queues}::text[], $${at.keys}::text[]) AS f(queue, key) WHERE f.key IS NOT NULL`;
    return `turn_wait AS MATERIALIZED (
  SELECT set_config('lock_timeout', $${at.timeout}::text, true) AS lock_timeout
), turns AS MATERIALIZED (
  SELECT count(*) AS n FROM (
    SELECT ${ACK_TURN("t.id")} FROM (
      SELECT DISTINCT ${ACK_TURN_ID("f.queue", "f.key")} AS id FROM ${followUpKeys}
        AND (SELECT w.lock_timeout FROM turn_wait AS w) IS NOT NULL
      ORDER BY 1 LIMIT ${TURN_LIMIT}
    ) AS t
  ) AS taken
), tried AS MATERIALIZED (
  SELECT k.queue, k.key, CASE WHEN w.n >= 0 THEN ${TRY_KEY_LOCK("k.queue", "k.key")} END AS taken
  FROM (SELECT DISTINCT f.queue, f.key FROM ${followUpKeys} ORDER BY 1, 2) AS k CROSS JOIN turns AS w
), busy_keys AS MATERIALIZED (
  SELECT COALESCE(array_agg(t.queue), '{}') AS queues, COALESCE(array_agg(t.key), '{}') AS keys
  FROM tried AS t WHERE NOT t.taken
), blocked AS MATERIALIZED (
  SELECT COALESCE(array_agg(DISTINCT f.parent_id), '{}') AS ids
  FROM unnest($${at.parents}::bigint[], $${at.queues}::text[], $${at.keys}::text[]) AS f(parent_id, queue, key), busy_keys AS b
  WHERE (f.queue, f.key) IN (SELECT * FROM unnest(b.queues, b.keys))
)`;
  };
  // The long statements below open with a comment naming them: pg_stat_activity cuts a query's text at 1 kB.
  // Columns of an ack_keyed row past kind and delivery, empty.
  const NO_ROW =
    "NULL::text, NULL::text, NULL::text, NULL::jsonb, NULL::text, NULL::float8, NULL::int, NULL::int, NULL::int, NULL::timestamptz, NULL::timestamptz, NULL::boolean";
  // The keyed ack runs on the deliveries whose follow-up keys were all taken (in the caller's order: rows
  // are locked in one order); `acked` are those it deleted (all, or those it names written).
  const keyedFollowUpAck = (heads: boolean) => {
    const fn = heads ? "ack_key_heads" : "ack_keyed";
    const parentKeys = heads ? ", m.queues, m.keys" : "";
    const params = "$12::int, $13::uuid, $14::double precision, $15::text, $16::boolean";
    const tries = followUpKeyTries({ parents: 3, queues: 4, keys: 7, timeout: 17 });
    return `/* ${fn} with follow-ups */ WITH ${tries}, mine AS MATERIALIZED (
  SELECT array_agg(d.id ORDER BY d.ord) AS ids, array_agg(d.token ORDER BY d.ord) AS tokens${
    heads ? ", array_agg(d.queue ORDER BY d.ord) AS queues, array_agg(d.key ORDER BY d.ord) AS keys" : ""
  }
  FROM unnest($1::bigint[], $2::uuid[]${heads ? ", $18::text[], $19::text[]" : ""}) WITH ORDINALITY
    AS d(id, token, ${heads ? "queue, key, " : ""}ord), blocked AS b
  WHERE NOT (d.id = ANY (b.ids))
), a AS MATERIALIZED (
  SELECT r.* FROM mine AS m, LATERAL ${names.quotedSchema}.${fn}(m.ids, m.tokens${parentKeys}, ${params}) AS r
  WHERE m.ids IS NOT NULL
), acked AS MATERIALIZED (
  SELECT s.id, s.token FROM mine AS m, unnest(m.ids, m.tokens) AS s(id, token)
  WHERE (SELECT x.delivery::int FROM a AS x WHERE x.kind = 'deleted') = cardinality(m.ids)
     OR s.id::text || '/' || s.token::text IN (SELECT x.delivery FROM a AS x WHERE x.kind = 'written')
), ${followUpRows("JOIN acked AS g ON g.id = f.parent_id", 3)}
SELECT a.* FROM a WHERE a.kind NOT IN ('deleted', 'written')
UNION ALL
-- From wake: its notifications are sent.
SELECT 'deleted', (SELECT count(*) FROM acked)::text, ${NO_ROW} FROM wake
UNION ALL
SELECT 'written', g.id::text || '/' || g.token::text, ${NO_ROW} FROM acked AS g
WHERE (SELECT count(*) FROM acked) < cardinality($1::bigint[])
UNION ALL
SELECT 'busy', d.id::text || '/' || d.token::text, ${NO_ROW}
FROM unnest($1::bigint[], $2::uuid[]) AS d(id, token), blocked AS b WHERE d.id = ANY (b.ids)`;
  };
  const keyedFollowUpValues = (p: KeyedFollowUpParams) => [
    p.ids,
    p.tokens,
    ...followUpValues(p),
    p.limit,
    p.token,
    p.leaseTtlMs,
    p.workerId,
    settings.synchronousCommit,
    p.turnTimeoutMs,
  ];
  const followUpValues = (p: FollowUpParams) => [
    p.parents,
    p.queues,
    p.payloads,
    p.headers,
    p.keys,
    p.availableAt,
    p.delaysMs,
    p.channel,
    p.wake,
  ];
  return {
    ackFollowUps: defineQuery(
      "ack_follow_ups",
      `${withSettings(settings, true)}gone AS (
  DELETE FROM ${m} AS t USING ${pairs} AS d(id, token)${also}
  WHERE t.id = d.id AND ${TOKEN} = d.token
  RETURNING t.id, ${KEY} AS key
), ${followUpRows("JOIN gone AS g ON g.id = f.parent_id", 3)}
SELECT count(*)::int AS deleted,
       CASE WHEN count(*) < cardinality($1::bigint[]) THEN COALESCE(array_agg(key), '{}') END AS keys,
       (SELECT count(*)::int FROM inserted) AS inserted,
       (SELECT sent FROM wake) AS sent
FROM gone`,
      (p) => [p.ids, p.tokens, ...followUpValues(p)],
    ),
    ackFollowUpKeys: defineQuery(
      "ack_follow_up_keys",
      `/* DELETE with keyed follow-ups */ ${withSettings(settings, true)}${followUpKeyTries({ parents: 3, queues: 4, keys: 7, timeout: 12 })}, gone AS (
  DELETE FROM ${m} AS t USING ${pairs} AS d(id, token), blocked AS b${also}
  WHERE t.id = d.id AND ${TOKEN} = d.token AND NOT (t.id = ANY (b.ids))
  RETURNING t.id, ${KEY} AS key
), ${followUpRows("JOIN gone AS g ON g.id = f.parent_id", 3)}
SELECT count(*)::int AS deleted,
       CASE WHEN count(*) < cardinality($1::bigint[]) THEN COALESCE(array_agg(key), '{}') END AS keys,
       (SELECT COALESCE(array_agg(d.id::text || '/' || d.token::text), '{}')
        FROM ${pairs} AS d(id, token), blocked AS b WHERE d.id = ANY (b.ids)) AS busy,
       (SELECT count(*)::int FROM inserted) AS inserted,
       (SELECT sent FROM wake) AS sent
FROM gone`,
      (p) => [p.ids, p.tokens, ...followUpValues(p), p.turnTimeoutMs],
    ),
    ackKeyedFollowUps: defineQuery("ack_keyed_follow_ups", keyedFollowUpAck(false), keyedFollowUpValues),
    ackKeyHeadsFollowUps: defineQuery("ack_key_heads_follow_ups", keyedFollowUpAck(true), (p) => [
      ...keyedFollowUpValues(p),
      p.parentQueues,
      p.parentKeys,
    ]),
    deadKeyed: defineQuery("dead_keyed", deadLetter, deadValues),
    promote: defineQuery(
      "promote",
      `SELECT * FROM ${names.quotedSchema}.promote_heads($1::text[], $2::text[], $3::int, $4::uuid, $5::double precision, $6::text)`,
      (p) => [p.queues, p.keys, p.limit, p.token, p.leaseTtlMs, p.workerId],
    ),
    ackKeyed: defineQuery(
      "ack_keyed",
      `SELECT * FROM ${names.quotedSchema}.ack_keyed($1::bigint[], $2::uuid[], $3::int, $4::uuid, $5::double precision, $6::text, $7::boolean)`,
      (p) => [p.ids, p.tokens, p.limit, p.token, p.leaseTtlMs, p.workerId, settings.synchronousCommit],
    ),
    ackKeyHeads: defineQuery(
      "ack_key_heads",
      `SELECT * FROM ${names.quotedSchema}.ack_key_heads($1::bigint[], $2::uuid[], $3::text[], $4::text[], $5::int, $6::uuid, $7::double precision, $8::text, $9::boolean)`,
      (p) => [
        p.ids,
        p.tokens,
        p.queues,
        p.keys,
        p.limit,
        p.token,
        p.leaseTtlMs,
        p.workerId,
        settings.synchronousCommit,
      ],
    ),
    ack: defineQuery(
      "ack",
      `${withSettings(settings, true)}gone AS (
  DELETE FROM ${m} AS t USING ${pairs} AS d(id, token)${also}
  WHERE t.id = d.id AND ${TOKEN} = d.token
  RETURNING ${KEY} AS key
)
SELECT count(*)::int AS deleted,
       -- array_agg of no rows is NULL, not '{}': without COALESCE "none deleted" would read as "all deleted".
       CASE WHEN count(*) < cardinality($1::bigint[]) THEN COALESCE(array_agg(key), '{}') END AS keys
FROM gone`,
      (p) => [p.ids, p.tokens],
    ),
    retry: defineQuery(
      "retry",
      `${withSettings(settings, false)}UPDATE ${m} AS t
SET acquired_token = NULL, acquired_at = NULL, lease_expires_at = NULL, acquired_by = NULL,
    available_at = now() + d.delay_ms * interval '1 millisecond',
    -- Saturated: a counter at its limit must not fail the batch's other rows.
    attempts_count = LEAST(t.attempts_count, 2147483646) + 1,
    failures_count = LEAST(t.failures_count, 2147483646) + d.failed,
    first_attempt_at = COALESCE(t.first_attempt_at, now()),
    last_attempt_at = now(),
    last_error = left(d.error, $6)
FROM unnest($1::bigint[], $2::uuid[], $3::double precision[], $4::text[], $5::int[])
     AS d(id, token, delay_ms, error, failed)${also}
WHERE t.id = d.id AND ${TOKEN} = d.token
RETURNING t.id::text || '/' || d.token::text AS key`,
      (p) => [p.ids, p.tokens, p.delaysMs, p.errors, p.failed, p.maxErrorLength],
    ),
    dead: defineQuery("dead", deadLetter, deadValues),
    // Only batches with an announcing queue run it: the others keep dead_letter() and pay nothing.
    deadAnnounced: defineQuery(
      "dead_announced",
      `SELECT * FROM ${names.quotedSchema}.dead_letter_announced($1::bigint[], $2::uuid[], $3::text[], $4::text[], $5::int[], $6::int[], $7::int, $8::boolean, $9::text[], $10::text[], $11::text)`,
      (p) => [...deadValues(p), p.announceQueues, p.announceTopics, p.channel],
    ),
    release: defineQuery(
      "release",
      `${withSettings(settings, false)}UPDATE ${m} AS t
SET acquired_token = NULL, acquired_at = NULL, lease_expires_at = NULL, acquired_by = NULL,
    deliveries_count = greatest(t.deliveries_count - 1, 0)
FROM ${pairs} AS d(id, token)${also}
WHERE t.id = d.id AND t.acquired_token = d.token
RETURNING t.id::text || '/' || d.token::text AS key`,
      (p) => [p.ids, p.tokens],
    ),
    renew: defineQuery(
      "renew",
      `${withSettings(settings, false)}UPDATE ${m} AS t
SET lease_expires_at = now() + $3::double precision * interval '1 millisecond'
FROM ${pairs} AS d(id, token)${also}
WHERE t.id = d.id AND t.acquired_token = d.token
RETURNING ${KEY} AS key`,
      (p) => [p.ids, p.tokens, p.leaseTtlMs],
    ),
    whereabouts: defineQuery(
      "whereabouts",
      `SELECT CASE WHEN t.id IS NULL THEN (CASE WHEN dl.id IS NULL THEN 'gone' ELSE 'dead' END)
            WHEN t.acquired_token IS NULL THEN 'unleased'
            WHEN t.acquired_token = d.token THEN 'held'
            ELSE 'taken' END AS fate
FROM unnest($1::bigint[], $2::uuid[]) WITH ORDINALITY AS d(id, token, ord)
LEFT JOIN ${m} AS t ON t.id = d.id
LEFT JOIN ${names.deadLetters} AS dl ON dl.id = d.id
ORDER BY d.ord`,
      (p) => [p.ids, p.tokens],
    ),
  };
}
