import { type Statement, statement } from "./executor.js";
import { KEY_LOCK } from "./key-lock.js";
import type { OutboxNames } from "./names.js";

/** Statements a producer runs inside its own transaction. Built once per schema. */
export interface ProduceStatements {
  /** $1 queue, $2 payload jsonb, $3 headers jsonb, $4 key, $5 available_at, $6 delay ms → id */
  insertOne: Statement;
  /** The same, plus $7 channel: also queues one wake-up notification, delivered at commit. */
  insertOneNotify: Statement;
  /** $1 queue, $2 jsonb array of {payload, headers, key, available_at, delay_ms} → ids in input order */
  insertMany: Statement;
  /** The same, plus $3 channel. */
  insertManyNotify: Statement;
  /** $1 channel, $2 queue: a wake-up outside any producer transaction (the trailing notification). */
  notify: Statement;
  /** $1 channel, $2 topic: the same for every queue subscribed to the topic. */
  notifyTopic: Statement;
  /**
   * `insertOne` with $7 dedupe key: inserts unless a message of the queue with that key is still in
   * messages → one row: the new id (`existing` false), or the pending message's id (`existing` true); no
   * row when the message it collided with is not visible to this statement (run it again).
   */
  insertOneDedupe: Statement;
  /** The same, plus $8 channel (the wake-up is queued even when nothing was inserted). */
  insertOneDedupeNotify: Statement;
  /**
   * `insertMany` whose items each carry a distinct `dedupe_key`, $3 those keys as text[] → one row per
   * item answered: (id, dedupe_key, existing); an item missing from the answer is to be run again.
   */
  insertManyDedupe: Statement;
  /** The same, plus $4 channel. */
  insertManyDedupeNotify: Statement;
  /** $1 queue, $2 dedupe key → (status, id): the `cancel` function (migrations/functions/cancel.sql). */
  cancel: Statement;
}

/** A row of the dedupe inserts: `existing` when a pending message already had the key. */
export interface DedupeRow {
  id: string | null;
  dedupe_key?: string;
  existing: boolean;
}

/** The answer of `cancel`. */
export interface CancelRow {
  status: "cancelled" | "delivering" | "not_found";
  id: string | null;
}

export interface InsertedRow {
  id: string;
}

/** Wakes the workers of a queue: `[channel, queue]`. */
export const NOTIFY = statement("notify", "SELECT pg_notify($1, $2)");

export function produceStatements(names: OutboxNames): ProduceStatements {
  // Delays are added to the server's clock, never the producer's, so skewed hosts cannot reorder rows.
  // A keyed row first takes its key's advisory lock (held to commit), and only then its id: the id is a
  // default evaluated after the FROM list, so same-key rows get ids in the order their producers commit.
  // The key-head trigger takes the same lock again (re-entrant) and marks whether the row heads its key.
  const insertOne = `INSERT INTO ${names.messages} (queue, payload, headers, key, available_at)
SELECT $1, $2::jsonb, $3::jsonb, $4, COALESCE($5::timestamptz, now() + $6::double precision * interval '1 millisecond')
FROM (SELECT 1) AS one
LEFT JOIN LATERAL (SELECT ${KEY_LOCK("$1", "$4::text")} WHERE $4::text IS NOT NULL) AS key_lock ON true
RETURNING id`;
  // Every key's lock before any id, in key order: two batches with the same keys in another order cannot
  // deadlock each other.
  const batchKeyLocks = `CROSS JOIN (
  SELECT count(*) FROM (
    SELECT ${KEY_LOCK("$1", "k.key")} FROM (
      SELECT DISTINCT i.item ->> 'key' AS key FROM jsonb_array_elements($2::jsonb) AS i(item)
      WHERE i.item ->> 'key' IS NOT NULL ORDER BY 1
    ) AS k
  ) AS taken
) AS key_locks`;
  const insertMany = `INSERT INTO ${names.messages} (queue, payload, headers, key, available_at)
SELECT $1, e.item -> 'payload', e.item -> 'headers', e.item ->> 'key',
       COALESCE((e.item ->> 'available_at')::timestamptz,
                now() + (e.item ->> 'delay_ms')::double precision * interval '1 millisecond')
FROM jsonb_array_elements($2::jsonb) WITH ORDINALITY AS e(item, ord)
${batchKeyLocks}
ORDER BY e.ord
RETURNING id`;
  // Dedupe keys (migrations 0017, 0020). ON CONFLICT against the partial unique index is race-free: a row
  // of another producer with the same key that is not yet committed makes this insert wait for that
  // transaction (it then inserts if the other rolled back, or does nothing if it committed). Its id is then
  // read by the statement's own snapshot, which cannot see a row committed while it waited: no row comes
  // back, and the caller runs the statement again (a fresh snapshot in READ COMMITTED; under REPEATABLE
  // READ Postgres raises a serialization failure instead). A BEFORE trigger has run for a skipped row (the
  // key-head trigger took the key's lock and drew an id): the row is discarded with its head mark.
  const arbiter = "ON CONFLICT (queue, dedupe_key) WHERE dedupe_key IS NOT NULL DO NOTHING";
  const insertOneDedupe = `WITH ins AS (
INSERT INTO ${names.messages} (queue, payload, headers, key, available_at, dedupe_key)
SELECT $1, $2::jsonb, $3::jsonb, $4, COALESCE($5::timestamptz, now() + $6::double precision * interval '1 millisecond'), $7::text
FROM (SELECT 1) AS one
LEFT JOIN LATERAL (SELECT ${KEY_LOCK("$1", "$4::text")} WHERE $4::text IS NOT NULL) AS key_lock ON true
${arbiter}
RETURNING id
), found AS (
SELECT ins.id::text AS id, false AS existing FROM ins
UNION ALL
SELECT m.id::text, true FROM ${names.messages} AS m
WHERE m.queue = $1 AND m.dedupe_key = $7::text AND NOT EXISTS (SELECT 1 FROM ins)
)`;
  const insertManyDedupe = `WITH ins AS (
INSERT INTO ${names.messages} (queue, payload, headers, key, available_at, dedupe_key)
SELECT $1, e.item -> 'payload', e.item -> 'headers', e.item ->> 'key',
       COALESCE((e.item ->> 'available_at')::timestamptz,
                now() + (e.item ->> 'delay_ms')::double precision * interval '1 millisecond'),
       e.item ->> 'dedupe_key'
FROM jsonb_array_elements($2::jsonb) WITH ORDINALITY AS e(item, ord)
${batchKeyLocks}
ORDER BY e.ord
${arbiter}
RETURNING id, dedupe_key
), found AS (
SELECT ins.id::text AS id, ins.dedupe_key, false AS existing FROM ins
UNION ALL
SELECT m.id::text, m.dedupe_key, true FROM ${names.messages} AS m
WHERE m.queue = $1 AND m.dedupe_key = ANY ($3::text[])
  AND m.dedupe_key NOT IN (SELECT ins.dedupe_key FROM ins)
)`;
  // The notification rides in the same statement (no extra round trip); the one-row subquery makes
  // pg_notify run once however many rows were inserted.
  return {
    insertOne: statement("insert_one", insertOne),
    insertOneNotify: statement(
      "insert_one_notify",
      `WITH ins AS (${insertOne}) SELECT ins.id FROM ins, (SELECT pg_notify($7, $1)) AS wake`,
    ),
    insertMany: statement("insert_many", `WITH ins AS (${insertMany}) SELECT id FROM ins ORDER BY id`),
    insertManyNotify: statement(
      "insert_many_notify",
      `WITH ins AS (${insertMany}) SELECT ins.id FROM ins, (SELECT pg_notify($3, $1)) AS wake ORDER BY ins.id`,
    ),
    notify: NOTIFY,
    notifyTopic: statement(
      "notify_topic",
      `SELECT count(pg_notify($1, q.queue)) FROM unnest(${names.quotedSchema}.topic_queues($2::text)) AS q(queue)`,
    ),
    insertOneDedupe: statement(
      "insert_one_dedupe",
      `${insertOneDedupe} SELECT f.id, f.existing FROM found AS f`,
    ),
    insertOneDedupeNotify: statement(
      "insert_one_dedupe_notify",
      `${insertOneDedupe} SELECT f.id, f.existing FROM (SELECT pg_notify($8, $1)) AS wake LEFT JOIN found AS f ON true`,
    ),
    insertManyDedupe: statement(
      "insert_many_dedupe",
      `${insertManyDedupe} SELECT f.id, f.dedupe_key, f.existing FROM found AS f`,
    ),
    insertManyDedupeNotify: statement(
      "insert_many_dedupe_notify",
      `${insertManyDedupe} SELECT f.id, f.dedupe_key, f.existing FROM (SELECT pg_notify($4, $1)) AS wake LEFT JOIN found AS f ON true`,
    ),
    cancel: statement(
      "cancel",
      `SELECT c.status, c.id::text AS id FROM ${names.quotedSchema}.cancel($1, $2) AS c`,
    ),
  };
}
