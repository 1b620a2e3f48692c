import { OutboxConfigError } from "../contract/errors.js";
import { validateQueueName } from "../contract/queue.js";
import { type TopicDefinition, validateTopicName, validateTopicPattern } from "../contract/topic.js";
import { type Executor, runQuery } from "../sql/executor.js";
import { DEFAULT_SCHEMA, outboxNames } from "../sql/names.js";
import {
  listSubscriptionsStatement,
  type SubscriptionRow,
  subscribeStatement,
  topicQueuesStatement,
  unsubscribeStatement,
} from "../sql/topics.js";

/**
 * Which queues receive which topics: rows of the subscriptions table, read by the database's fan-out in
 * every producer's transaction. A change applies to events published after it commits; messages already
 * written stay with their queue (unsubscribing never takes back a queued copy).
 */

/** Which subscription {@link subscribe} and {@link unsubscribe} act on. */
export interface SubscriptionTarget {
  /** A topic name or pattern: `order.placed`, `order.*` (one segment), `order.#` (any number). */
  topic: string | TopicDefinition<unknown, unknown>;
  /** The queue that receives a copy of each event. */
  queue: string | { name: string };
  /** The outbox schema (default `outbox`). */
  schema?: string;
}

function target(t: SubscriptionTarget): { pattern: string; queue: string; schema: string } {
  if (!t || typeof t !== "object") throw new OutboxConfigError("subscription", "must be { topic, queue }");
  const pattern = validateTopicPattern(typeof t.topic === "string" ? t.topic : t.topic?.topic, "topic");
  const queue = validateQueueName(typeof t.queue === "string" ? t.queue : t.queue?.name, "queue");
  return { pattern, queue, schema: t.schema ?? DEFAULT_SCHEMA };
}

/** Subscribe a queue to a topic or pattern. Idempotent: `created` is false when it already was. */
export async function subscribe(db: Executor, t: SubscriptionTarget): Promise<{ created: boolean }> {
  const { pattern, queue, schema } = target(t);
  const [row] = await runQuery(db, subscribeStatement(outboxNames(schema)), { pattern, queue });
  return { created: row?.created === true };
}

/** Remove a subscription. Copies already written stay deliverable. `removed` is false when there was none. */
export async function unsubscribe(db: Executor, t: SubscriptionTarget): Promise<{ removed: boolean }> {
  const { pattern, queue, schema } = target(t);
  const [row] = await runQuery(db, unsubscribeStatement(outboxNames(schema)), { pattern, queue });
  return { removed: row?.removed === true };
}

/** One row of {@link listSubscriptions}: `queue` receives the events of every topic `topic` matches. */
export interface Subscription {
  /** The topic name or pattern subscribed to. */
  topic: string;
  queue: string;
  createdAt: Date;
}

/** Subscriptions, by topic pattern then queue, optionally of one queue or one exact pattern only. */
export async function listSubscriptions(
  db: Executor,
  filter: { queue?: string; topic?: string; schema?: string } = {},
): Promise<Subscription[]> {
  const queue = filter.queue === undefined ? null : validateQueueName(filter.queue, "queue");
  const pattern = filter.topic === undefined ? null : validateTopicPattern(filter.topic, "topic");
  const rows = await runQuery<{ queue: string | null; pattern: string | null }, SubscriptionRow>(
    db,
    listSubscriptionsStatement(outboxNames(filter.schema ?? DEFAULT_SCHEMA)),
    { queue, pattern },
  );
  return rows.map((r) => ({ topic: r.pattern, queue: r.queue, createdAt: r.created_at }));
}

/** The queues an event published to `topic` now would reach, in name order (the database's own rule). */
export async function subscribersOf(
  db: Executor,
  topic: string | TopicDefinition<unknown, unknown>,
  options: { schema?: string } = {},
): Promise<string[]> {
  const name = validateTopicName(typeof topic === "string" ? topic : topic.topic);
  const [row] = await runQuery(db, topicQueuesStatement(outboxNames(options.schema ?? DEFAULT_SCHEMA)), {
    topic: name,
  });
  return row?.queues ?? [];
}
