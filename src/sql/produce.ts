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
}

export interface InsertedRow {
  id: string;
}

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
  const insertMany = `INSERT INTO ${names.messages} (queue, payload, headers, key, available_at)
SELECT $1, e.item -> 'payload', e.item -> 'headers', e.item ->> 'key',
       COALESCE((e.item ->> 'available_at')::timestamptz,
                now() + (e.item ->> 'delay_ms')::double precision * interval '1 millisecond')
FROM jsonb_array_elements($2::jsonb) WITH ORDINALITY AS e(item, ord)
CROSS JOIN (
  -- Every key's lock before any id, in key order: two batches with the same keys in another order
  -- cannot deadlock each other.
  SELECT count(*) FROM (
    SELECT ${KEY_LOCK("$1", "k.key")} FROM (
      SELECT DISTINCT i.item ->> 'key' AS key FROM jsonb_array_elements($2::jsonb) AS i(item)
      WHERE i.item ->> 'key' IS NOT NULL ORDER BY 1
    ) AS k
  ) AS taken
) AS key_locks
ORDER BY e.ord
RETURNING id`;
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
    notify: statement("notify", "SELECT pg_notify($1, $2)"),
    notifyTopic: statement(
      "notify_topic",
      `SELECT count(pg_notify($1, q.queue)) FROM unnest(${names.quotedSchema}.topic_queues($2::text)) AS q(queue)`,
    ),
  };
}
