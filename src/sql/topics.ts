import { defineQuery, type Query, type Statement, statement } from "./executor.js";
import type { OutboxNames } from "./names.js";

/** One copy of an event, written for one subscribed queue. */
export interface CopyRow {
  /** 1-based position of the event in the batch. */
  ord: number;
  id: string;
  queue: string;
}

/** Statements a producer runs in its own transaction to publish to a topic. Built once per schema. */
export interface TopicStatements {
  /** $1 topic, $2 jsonb array of {payload, headers, key, available_at, delay_ms} → CopyRow per copy */
  fanOut: Statement;
  /** The same, plus $3 channel: one wake-up per queue that got a copy, delivered at commit. */
  fanOutNotify: Statement;
}

export function topicStatements(names: OutboxNames): TopicStatements {
  const fanOut = `SELECT f.ord, f.id::text AS id, f.queue FROM ${names.quotedSchema}.fan_out($1::text, $2::jsonb) AS f`;
  return {
    fanOut: statement("fan_out", fanOut),
    // The copies are known only once fan_out ran: notify from its result, once per queue (the uncorrelated
    // subquery runs once, and not at all when no one subscribes).
    fanOutNotify: statement(
      "fan_out_notify",
      `WITH c AS MATERIALIZED (${fanOut})
SELECT c.ord, c.id, c.queue, (SELECT count(pg_notify($3, q.queue)) FROM (SELECT DISTINCT queue FROM c) AS q) AS woken
FROM c ORDER BY c.id`,
    ),
  };
}

/** A subscription: `queue` receives the events of every topic `pattern` matches. */
export interface SubscriptionRow {
  pattern: string;
  queue: string;
  created_at: Date;
}

export function subscribeStatement(
  names: OutboxNames,
): Query<{ pattern: string; queue: string }, { created: boolean }> {
  return defineQuery(
    "subscribe",
    `WITH ins AS (
  INSERT INTO ${names.subscriptions} (pattern, queue) VALUES ($1::text, $2::text)
  ON CONFLICT (pattern, queue) DO NOTHING RETURNING 1
) SELECT EXISTS (SELECT FROM ins) AS created`,
    (p) => [p.pattern, p.queue],
  );
}

export function unsubscribeStatement(
  names: OutboxNames,
): Query<{ pattern: string; queue: string }, { removed: boolean }> {
  return defineQuery(
    "unsubscribe",
    `WITH del AS (
  DELETE FROM ${names.subscriptions} WHERE pattern = $1::text AND queue = $2::text RETURNING 1
) SELECT EXISTS (SELECT FROM del) AS removed`,
    (p) => [p.pattern, p.queue],
  );
}

/** Subscriptions, by pattern then queue; each filter null for all. */
export function listSubscriptionsStatement(
  names: OutboxNames,
): Query<{ queue: string | null; pattern: string | null }, SubscriptionRow> {
  return defineQuery(
    "subscriptions_list",
    `SELECT pattern, queue, created_at FROM ${names.subscriptions}
WHERE ($1::text IS NULL OR queue = $1::text) AND ($2::text IS NULL OR pattern = $2::text)
ORDER BY pattern, queue`,
    (p) => [p.queue, p.pattern],
  );
}

/** The queues that receive an event published to $1 now. */
export function topicQueuesStatement(names: OutboxNames): Query<{ topic: string }, { queues: string[] }> {
  return defineQuery("topic_queues", `SELECT ${names.quotedSchema}.topic_queues($1::text) AS queues`, (p) => [
    p.topic,
  ]);
}

/**
 * Dead letters kept because no queue subscribed to their topic, fanned out to the queues subscribed now
 * (those still without one stay) → one row per copy. $2 is the wake channel.
 */
export function routeUnroutedStatement(
  names: OutboxNames,
): Query<{ ids: string[] }, { dead_id: string; id: string; queue: string }> {
  return defineQuery(
    "route_unrouted",
    `WITH c AS MATERIALIZED (
  SELECT r.dead_id::text AS dead_id, r.id::text AS id, r.queue FROM ${names.quotedSchema}.route_unrouted($1::bigint[]) AS r
)
SELECT c.dead_id, c.id, c.queue, (SELECT count(pg_notify($2, q.queue)) FROM (SELECT DISTINCT queue FROM c) AS q) AS woken
FROM c ORDER BY c.id`,
    (p) => [p.ids, names.channel],
  );
}
