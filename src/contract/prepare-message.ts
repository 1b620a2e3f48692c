import { z } from "zod";
import { withTraceContext } from "../util/tracing.js";
import { OutboxPayloadError } from "./errors.js";
import { fieldPath } from "./field-path.js";
import type { PreparedFollowUp } from "./follow-up.js";
import { headerNameProblem, headerValueProblem } from "./header-rules.js";
import { encodePayload } from "./payload.js";
import type { DedupePublishOptions, PublishOptions as PlainPublishOptions } from "./publish-options.js";

/** The options any publish may be given (checked here, whichever form). */
type PublishOptions = PlainPublishOptions | DedupePublishOptions;

import { type QueueDefinition, validateQueueName } from "./queue.js";
import { textProblem } from "./storable-text.js";
import { TOPIC_HEADER, type TopicDefinition, validateTopicName } from "./topic.js";

/**
 * The one preparation of a message, for `publish`, `publishMany` and follow-ups alike: every check that
 * Postgres or a relay's transport would otherwise fail later runs here, before any statement is sent, so
 * a refusal never aborts the caller's transaction (or a batch of acks) and names the field.
 */

/** The longest dedupe key, in UTF-8 bytes (with the queue name, well within a btree index entry). */
export const MAX_DEDUPE_KEY_BYTES = 1024;

const publishOptionsSchema = z
  .strictObject({
    key: z.string().min(1).max(1024).optional(),
    delayMs: z.number().finite().min(0).optional(),
    availableAt: z
      .date()
      .refine((d) => !Number.isNaN(d.getTime()), "must be a valid Date")
      .optional(),
    headers: z.record(z.string(), z.string()).optional(),
    dedupeKey: z
      .string()
      .min(1, "must not be empty")
      .refine(
        (k) => Buffer.byteLength(k) <= MAX_DEDUPE_KEY_BYTES,
        `must be at most ${MAX_DEDUPE_KEY_BYTES} UTF-8 bytes`,
      )
      .optional(),
  })
  .refine((o) => o.delayMs === undefined || o.availableAt === undefined, {
    message: "give delayMs or availableAt, not both",
    path: ["availableAt"],
  });

type CheckedOptions = z.output<typeof publishOptionsSchema>;

/**
 * The times a message may name: from the year 1 to the year 9999. Postgres takes more, but beyond it
 * toISOString writes a six-digit year (±YYYYYY) that Postgres refuses, and nothing is scheduled that far.
 */
const EARLIEST_MS = Date.parse("0001-01-01T00:00:00Z");
const END_MS = Date.parse("+010000-01-01T00:00:00Z");

/** One message validated and encoded, ready to insert. */
export type PreparedMessage = PreparedFollowUp;

/** A queue given by name or by definition, as a definition, its name validated either way. */
export function resolveQueue<I, O>(queue: QueueDefinition<I, O> | string): QueueDefinition<I, O> {
  if (typeof queue === "string") return { name: validateQueueName(queue), schema: undefined };
  // defineQueue checked it, but a hand-built definition reaches here unchecked.
  validateQueueName(queue.name);
  return queue;
}

/**
 * Validate and encode one message: queue name, options (key, delay or time, headers), payload (schema,
 * what jsonb cannot store, non-finite numbers, size). Throws OutboxConfigError for the queue name and
 * OutboxPayloadError for the rest, naming the field. The trace context is injected only if tracing was
 * already loaded: this is synchronous (the publisher and the worker load it first).
 */
export function prepareMessage<I, O>(
  queueRef: QueueDefinition<I, O> | string,
  payload: I,
  opts: PublishOptions | undefined,
  maxPayloadBytes: number,
): PreparedMessage {
  return prepareFor(resolveQueue(queueRef), payload, opts, maxPayloadBytes);
}

/** {@link prepareMessage} for each item of a batch of one queue; a refusal names the item's index. */
export function prepareBatch<I, O>(
  queueRef: QueueDefinition<I, O> | string,
  items: readonly ({ payload: I } & PublishOptions)[],
  maxPayloadBytes: number,
): PreparedMessage[] {
  return prepareEach(resolveQueue(queueRef), items, maxPayloadBytes);
}

/** A topic given by name or by definition, as a definition, its name validated either way. */
export function resolveTopic<I, O>(topic: TopicDefinition<I, O> | string): TopicDefinition<I, O> {
  if (typeof topic === "string") return { topic: validateTopicName(topic), schema: undefined };
  validateTopicName(topic.topic);
  return topic;
}

/**
 * {@link prepareMessage} for an event of a topic: the same checks, against the topic's schema. `queue` of
 * the result (and of a refusal) is the topic's name; the database writes one copy per subscriber.
 */
export function prepareTopicMessage<I, O>(
  topicRef: TopicDefinition<I, O> | string,
  payload: I,
  opts: PublishOptions | undefined,
  maxPayloadBytes: number,
): PreparedMessage {
  const topic = resolveTopic(topicRef);
  refuseTopicDedupe(topic.topic, opts);
  return prepareFor({ name: topic.topic, schema: topic.schema }, payload, opts, maxPayloadBytes);
}

/** {@link prepareTopicMessage} for each item of a batch of one topic; a refusal names the item's index. */
export function prepareTopicBatch<I, O>(
  topicRef: TopicDefinition<I, O> | string,
  items: readonly ({ payload: I } & PublishOptions)[],
  maxPayloadBytes: number,
): PreparedMessage[] {
  const topic = resolveTopic(topicRef);
  items.forEach((item, index) => {
    try {
      refuseTopicDedupe(topic.topic, item);
    } catch (error) {
      if (!(error instanceof OutboxPayloadError)) throw error;
      throw new OutboxPayloadError(error.queue, error.reason, { field: error.field, index });
    }
  });
  return prepareEach({ name: topic.topic, schema: topic.schema }, items, maxPayloadBytes);
}

/**
 * Topics take no dedupe key: each subscriber's copy is its own message, and "one pending event" would have
 * to hold for all of them at once (a copy delivered frees one queue's key, not the others').
 */
function refuseTopicDedupe(topic: string, opts: { dedupeKey?: unknown } | undefined): void {
  if (opts?.dedupeKey !== undefined)
    refuse(
      topic,
      "dedupeKey",
      "is not supported when publishing to a topic: publish to each queue with its own dedupeKey instead",
    );
}

/**
 * A handler's follow-ups take no dedupe key: they are inserted by the worker's ack statement, which has no
 * "already pending" answer to give. Called by the follow-up collector before anything is prepared.
 */
export function refuseFollowUpDedupe(queue: string, opts: { dedupeKey?: unknown } | undefined): void {
  if (opts?.dedupeKey !== undefined)
    refuse(
      queue,
      "dedupeKey",
      "is not supported on a follow-up (message.publish): publish from the handler's own transaction to dedupe",
    );
}

function prepareEach<I, O>(
  queue: QueueDefinition<I, O>,
  items: readonly ({ payload: I } & PublishOptions)[],
  maxPayloadBytes: number,
): PreparedMessage[] {
  return items.map((item, index) => {
    const { payload, ...options } = item;
    try {
      return prepareFor(queue, payload, options, maxPayloadBytes);
    } catch (error) {
      if (!(error instanceof OutboxPayloadError)) throw error;
      throw new OutboxPayloadError(error.queue, error.reason, { field: error.field, index });
    }
  });
}

function prepareFor<I, O>(
  queue: QueueDefinition<I, O>,
  payload: I,
  opts: PublishOptions | undefined,
  maxPayloadBytes: number,
): PreparedMessage {
  const o = checkOptions(queue.name, opts);
  const payloadText = encodePayload(queue as QueueDefinition, payload, maxPayloadBytes);
  // After the caller's own: a propagator's headers are checked like theirs.
  const headers = withTraceContext(o.headers) ?? {};
  checkHeaders(queue.name, headers);
  return {
    queue: queue.name,
    payloadText,
    key: o.key ?? null,
    headers,
    delayMs: o.delayMs ?? null,
    availableAt: o.availableAt ?? null,
  };
}

function refuse(queue: string, field: string, problem: string): never {
  throw new OutboxPayloadError(queue, `${field}: ${problem}`, { field });
}

function checkOptions(queue: string, opts: PublishOptions | undefined): CheckedOptions {
  const result = publishOptionsSchema.safeParse(opts ?? {});
  if (!result.success) {
    const issues = result.error.issues;
    const described = issues.map((i) => `${fieldPath("", i.path) || "(options)"}: ${i.message}`);
    throw new OutboxPayloadError(queue, `invalid options: ${described.join("; ")}`, {
      field: fieldPath("", issues[0]?.path ?? []) || "options",
    });
  }
  const o = result.data;
  if (o.key !== undefined) {
    const problem = textProblem(o.key);
    if (problem) refuse(queue, "key", problem);
  }
  if (o.dedupeKey !== undefined) {
    const problem = textProblem(o.dedupeKey);
    if (problem) refuse(queue, "dedupeKey", problem);
  }
  if (o.delayMs !== undefined && Date.now() + o.delayMs >= END_MS)
    refuse(queue, "delayMs", `${o.delayMs} ms from now is past the year 9999`);
  if (o.availableAt !== undefined) {
    const at = o.availableAt.getTime();
    if (at < EARLIEST_MS || at >= END_MS)
      refuse(queue, "availableAt", "must fall between the years 1 and 9999");
  }
  return o;
}

function checkHeaders(queue: string, headers: Record<string, string>): void {
  for (const [name, value] of Object.entries(headers)) {
    // A subscriber reads the topic from this header: a producer's own would make it lie.
    if (name.toLowerCase() === TOPIC_HEADER)
      refuse(
        queue,
        fieldPath("headers", [name]),
        "is reserved: it carries the topic an event was published to",
      );
    const problem = headerNameProblem(name) ?? headerValueProblem(value);
    if (problem) refuse(queue, fieldPath("headers", [name]), problem);
  }
}
