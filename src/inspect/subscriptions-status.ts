import { OutboxConfigError } from "../contract/errors.js";
import { type Executor, runQuery } from "../sql/executor.js";
import {
  subscriptionsAccessStatement,
  type TopicSubscribersRow as TopicSubscribers,
  topicSubscribersStatement,
  unroutedTopicsStatement,
} from "../sql/inspect.js";
import { outboxNames } from "../sql/names.js";

export type { TopicSubscribersRow as TopicSubscribers } from "../sql/inspect.js";

/** The dead-letter reason of an event published to a topic no queue subscribed to (migration 0012). */
export const NO_SUBSCRIBERS = "no_subscribers";

/** The topics of one {@link TopicStatus}'s kept events. */
export interface UnroutedTopic {
  topic: string;
  /** Events kept as dead letters `no_subscribers`. */
  events: number;
  /** Seconds since the oldest of them was kept. */
  oldest_age_s: number;
}

/** Events published to topics no queue subscribed to, kept as dead letters `no_subscribers`. */
export interface UnroutedEvents {
  /** Kept events, all topics together. */
  events: number;
  /** Topics with kept events, all of them. */
  topics: number;
  /** Per topic, most events first, at most `limit` topics: `topics` says how many there are. */
  byTopic: UnroutedTopic[];
}

/** Who receives what, and what nobody received: the topic side of `outbox-worker status`. */
export interface TopicStatus {
  /**
   * Each topic pattern subscribed to, with its queues, by pattern; `null` when this role may not read the
   * subscriptions table (a worker role granted without it): shown as unknown rather than as none.
   */
  subscriptions: TopicSubscribers[] | null;
  unrouted: UnroutedEvents;
}

/** Options of {@link topicStatus}. */
export interface TopicStatusOptions {
  /** The most topics of kept events to list, 1 to 1000 (default 50); the totals count them all. */
  limit?: number;
}

export const DEFAULT_UNROUTED_TOPICS = 50;

/**
 * The subscriptions (pattern → queues) and, per topic, the events kept because no queue subscribed to it
 * when they were published (replay fans them out to the topic's subscribers of that moment:
 * `outbox-worker dead-letters replay --reason no_subscribers`). Lease-free and lock-free, like
 * {@link queueStatus}; its dead-letter count reads the dead_letters table, so poll it every few seconds.
 *
 * @param db - a pg pool or client, or a Kysely instance
 * @param schema - the outbox schema, usually `"outbox"` ({@link DEFAULT_SCHEMA})
 */
export async function topicStatus(
  db: Executor,
  schema: string,
  options: TopicStatusOptions = {},
): Promise<TopicStatus> {
  const limit = options.limit ?? DEFAULT_UNROUTED_TOPICS;
  if (!Number.isInteger(limit) || limit < 1 || limit > 1000) {
    throw new OutboxConfigError("limit", `must be a whole number from 1 to 1000, got ${limit}`);
  }
  const names = outboxNames(schema);
  const [access] = await runQuery(db, subscriptionsAccessStatement(names), {});
  let subscriptions: TopicSubscribers[] | null = [];
  if (access?.present) {
    subscriptions = access.readable ? await runQuery(db, topicSubscribersStatement(names), {}) : null;
  }
  const rows = await runQuery(db, unroutedTopicsStatement(names), { limit });
  return {
    subscriptions,
    unrouted: {
      events: rows[0]?.total ?? 0,
      topics: rows[0]?.topics ?? 0,
      byTopic: rows.map((r) => ({ topic: r.topic, events: r.events, oldest_age_s: r.oldest_age_s })),
    },
  };
}
