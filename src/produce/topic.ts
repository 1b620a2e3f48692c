import type { z } from "zod";
import { type QueueDefinition, validateQueueName } from "../contract/queue.js";
import { type TopicDefinition, validateTopicName } from "../contract/topic.js";

/** Define a typed topic: `publishToTopic` accepts the schema's input type and stores its output. */
export function defineTopic<S extends z.ZodType>(
  topic: string,
  schema: S,
): TopicDefinition<z.input<S>, z.output<S>>;
/** Define a topic whose events are any JSON value. */
export function defineTopic(topic: string): TopicDefinition<unknown, unknown>;
export function defineTopic(topic: string, schema?: z.ZodType): TopicDefinition {
  return { topic: validateTopicName(topic), schema };
}

/**
 * A subscriber's queue for a topic, typed by the topic's schema: its handler gets the event as the topic
 * defines it (and a payload that fails the schema is dead-lettered `invalid_payload` by that queue alone).
 */
export function subscriberQueue<I, O>(topic: TopicDefinition<I, O>, queue: string): QueueDefinition<I, O> {
  return { name: validateQueueName(queue), schema: topic.schema };
}
