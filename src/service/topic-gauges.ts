import type pg from "pg";
import type { Logger } from "pino";
import { topicStatus } from "../inspect/subscriptions-status.js";
import type { MetricMakers } from "./metric-makers.js";

/**
 * Topics are named by producers, not declared: a bug could publish to many. The gauge keeps a series for
 * the topics with the most kept events and sums the rest under one label no topic can have.
 */
const UNROUTED_TOPIC_SERIES = 50;
export const OTHER_TOPICS_LABEL = "(other)";

/** Subscriptions per queue and events kept unrouted per topic, from the database. */
export function createTopicGauges(
  make: MetricMakers,
  log: Logger,
): (pool: pg.Pool, schema: string) => Promise<void> {
  const { gauge } = make;
  const subscriptions = gauge(
    "outbox_subscriptions",
    "Topic patterns the queue is subscribed to (rows of the subscriptions table).",
    ["queue"],
  );
  const unrouted = gauge(
    "outbox_unrouted_events",
    `Events kept as dead letters no_subscribers: published to a topic no queue subscribed to. At most ${UNROUTED_TOPIC_SERIES} topics, the rest summed under topic="${OTHER_TOPICS_LABEL}".`,
    ["topic"],
  );
  const subscribedQueues = new Set<string>();
  let unroutedTopics = new Set<string>();
  let subscriptionsHidden = false;

  return async (pool, schema) => {
    const topics = await topicStatus(pool, schema, { limit: UNROUTED_TOPIC_SERIES });
    if (topics.subscriptions === null) {
      // A worker role granted without SELECT on subscriptions: no series rather than a wrong 0. Info, once:
      // most roles are granted so, and an outbox that uses no topics loses nothing.
      if (!subscriptionsHidden) {
        log.info("outbox_subscriptions is not exported: this role may not read the subscriptions table");
      }
      subscriptionsHidden = true;
      subscriptions.reset();
      subscribedQueues.clear();
    } else {
      subscriptionsHidden = false;
      const counts = new Map<string, number>();
      for (const s of topics.subscriptions) {
        for (const queue of s.queues) counts.set(queue, (counts.get(queue) ?? 0) + 1);
      }
      // A queue unsubscribed from everything drops out of the query: 0, not its last count.
      for (const queue of subscribedQueues) if (!counts.has(queue)) counts.set(queue, 0);
      for (const [queue, n] of counts) {
        subscriptions.set({ queue }, n);
        subscribedQueues.add(queue);
      }
    }
    // Kept events' topics come and go with producers' mistakes: a topic replayed or purged loses its
    // series instead of keeping a 0 forever, so the label set stays within UNROUTED_TOPIC_SERIES + 1.
    const present = new Set<string>();
    const { unrouted: kept } = topics;
    for (const t of kept.byTopic) {
      unrouted.set({ topic: t.topic }, t.events);
      present.add(t.topic);
    }
    const rest = kept.events - kept.byTopic.reduce((n, t) => n + t.events, 0);
    if (rest > 0) {
      unrouted.set({ topic: OTHER_TOPICS_LABEL }, rest);
      present.add(OTHER_TOPICS_LABEL);
    }
    for (const topic of unroutedTopics) if (!present.has(topic)) unrouted.remove({ topic });
    unroutedTopics = present;
  };
}
