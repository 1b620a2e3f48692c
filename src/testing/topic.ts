/**
 * One topic event through its subscribers' handlers, the way the database and the workers treat it: the
 * event is checked and encoded as `publishToTopic` does (the topic's schema, options, headers), each queue
 * whose `subscribe` matches the topic gets its own copy (header `outbox-topic`), and each copy runs through
 * {@link testHandler} on its own: its own schema check, retry or dead-letter decision. One subscriber's
 * failure never touches another's outcome, as in the worker.
 */

import type { Handler, QueueConfig } from "../contract/handler.js";
import { DEFAULT_MAX_PAYLOAD_BYTES } from "../contract/payload.js";
import { prepareTopicMessage } from "../contract/prepare-message.js";
import { type TopicDefinition, topicMatches } from "../contract/topic.js";
import type { Clock } from "./clock.js";
import { type HarnessOptions, testHandler } from "./harness.js";
import type { TestOutcome } from "./outcome.js";

/**
 * The subscribers, by queue name: what `WorkerOptions.queues` takes. A `QueueConfig` with `subscribe`
 * gets a copy only of the topics its patterns match; an entry without (or a bare handler) is taken as
 * subscribed to the topic.
 */
export type SubscriberHandlers = Record<string, QueueConfig | Handler>;

/** The event as a producer publishes it, and the clock every copy runs on. */
export interface TopicEventOptions {
  /** The event's ordering key (each subscriber orders its own copies by it). Default none. */
  key?: string;
  /** The producer's headers; each copy adds `outbox-topic`. Default {}. */
  headers?: Record<string, string>;
  /** Default: the clock's now. */
  createdAt?: Date;
  /** The clock every copy runs on (default the harness's). Advance it once: every copy's timer is set. */
  clock?: Clock;
}

/** Each receiving queue's outcome, by queue name, in queue-name order. Empty when no queue's `subscribe` matched. */
export type TopicOutcomes = Record<string, TestOutcome>;

/**
 * Publishes one event (the value as published: parsed by the topic's schema, a refusal thrown as
 * `publishToTopic` throws it) and resolves with what the worker would write for each subscriber's copy.
 */
export type TopicRun = (
  topic: TopicDefinition<unknown, unknown> | string,
  payload: unknown,
  event?: TopicEventOptions,
) => Promise<TopicOutcomes>;

/**
 * A harness for the subscribers of a topic: `subscribers` maps each queue to its handler or QueueConfig
 * (`handle(subscriberQueue(topic, "billing"), fn, { maxAttempts })`); `options` are the worker-level
 * fallbacks, as {@link testHandler} takes them. Every handler runs once per event, concurrently; copies get
 * ids "1", "2", … in queue-name order, as the database writes them.
 */
export function testTopic(
  subscribers: SubscriberHandlers,
  options: Omit<HarnessOptions, "queue"> = {},
): TopicRun {
  const queues = Object.keys(subscribers)
    .sort()
    .map((queue) => {
      const config = subscribers[queue] as QueueConfig | Handler;
      return {
        queue,
        // Settings checked now, by the worker's own parser (a bad `subscribe` pattern included).
        run: testHandler(config, { ...options, queue }),
        patterns: typeof config === "function" ? undefined : config.subscribe,
      };
    });
  return async (topicRef, payload, event = {}) => {
    const published = prepareTopicMessage(
      topicRef,
      payload,
      {
        ...(event.key === undefined ? {} : { key: event.key }),
        ...(event.headers === undefined ? {} : { headers: event.headers }),
      },
      DEFAULT_MAX_PAYLOAD_BYTES,
    );
    const topic = published.queue;
    const receiving = queues.filter(
      (q) => q.patterns === undefined || q.patterns.some((pattern) => topicMatches(pattern, topic)),
    );
    // Started together, so one clock.advance() reaches every copy's timeout; none waits for another.
    const outcomes = await Promise.all(
      receiving.map(({ run }, i) =>
        run(undefined, {
          id: String(i + 1),
          topic,
          key: published.key,
          headers: published.headers,
          rawPayload: published.payloadText,
          ...(event.createdAt === undefined ? {} : { createdAt: event.createdAt }),
          ...(event.clock === undefined ? {} : { clock: event.clock }),
        }),
      ),
    );
    return Object.fromEntries(receiving.map(({ queue }, i) => [queue, outcomes[i] as TestOutcome]));
  };
}
