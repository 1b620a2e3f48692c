import { z } from "zod";
import { OutboxConfigError } from "../contract/errors.js";
import type { QueueDefinition } from "../contract/queue.js";
import type { TopicDefinition } from "../contract/topic.js";

/** A JSON Schema document, as plain JSON. */
export type JsonSchema = Record<string, unknown>;

/**
 * The JSON Schema dialects written here: 2020-12 for the exported files (what current validators and
 * generators read), draft-07 inside AsyncAPI 3.0 (its Schema Object is a draft-07 superset).
 */
export type SchemaDialect = "draft-2020-12" | "draft-07";

/**
 * The JSON Schema of what a queue stores and relays: the output side of its zod schema (publish stores the
 * parsed value, so defaults are filled in and unknown keys stripped). A queue without a schema takes any
 * JSON value: `{}`. A schema JSON Schema cannot express (a transform, a date, a bigint…) throws an
 * OutboxConfigError naming the queue: a consumer must not be handed a schema that lies.
 */
export function payloadJsonSchema(
  queue: QueueDefinition<unknown, unknown>,
  dialect: SchemaDialect = "draft-2020-12",
): JsonSchema {
  return zodJsonSchema(queue.schema, dialect, `queue "${queue.name}"`);
}

/** {@link payloadJsonSchema} of a topic: its events' schema, which every subscriber's copy holds. */
export function topicJsonSchema(
  topic: TopicDefinition<unknown, unknown>,
  dialect: SchemaDialect = "draft-2020-12",
): JsonSchema {
  return zodJsonSchema(topic.schema, dialect, `topic "${topic.topic}"`);
}

function zodJsonSchema(schema: unknown, dialect: SchemaDialect, field: string): JsonSchema {
  if (schema === undefined) return {};
  let written: JsonSchema;
  try {
    written = z.toJSONSchema(schema as z.ZodType, {
      io: "output",
      target: dialect === "draft-07" ? "draft-7" : "draft-2020-12",
      unrepresentable: "throw",
    }) as JsonSchema;
  } catch (error) {
    throw new OutboxConfigError(
      field,
      `its zod schema cannot be written as JSON Schema: ${(error as Error).message}; describe what is stored instead (e.g. z.iso.datetime() rather than z.date(), no .transform())`,
    );
  }
  // The dialect is the document's business (the file's $schema, AsyncAPI's own): not each payload's.
  const { $schema: _, ...rest } = written;
  return rest;
}

const DIALECT_2020_12 = "https://json-schema.org/draft/2020-12/schema";

/**
 * The topic whose schema a queue shares: one made with `subscriberQueue(topic, name)` (or `handle()` of
 * it) holds the topic's very zod schema. Identity, not likeness: two schemas that merely look alike may
 * change apart.
 */
export function sharedTopic(
  queue: QueueDefinition<unknown, unknown>,
  topics: readonly TopicDefinition<unknown, unknown>[],
): TopicDefinition<unknown, unknown> | undefined {
  if (queue.schema === undefined) return undefined;
  return topics.find((t) => t.schema === queue.schema);
}

/**
 * A queue's exported schema file: the payload schema named for the queue, JSON Schema 2020-12. A
 * subscriber queue sharing a topic's schema (see {@link sharedTopic}) refers to the topic's file instead
 * of repeating it, so a code generator makes one type for the topic and its subscribers.
 */
export function queueSchemaDocument(
  queue: QueueDefinition<unknown, unknown>,
  topics: readonly TopicDefinition<unknown, unknown>[] = [],
): JsonSchema {
  const topic = sharedTopic(queue, topics);
  const head = { $schema: DIALECT_2020_12, $id: schemaFileName(queue.name), title: queue.name };
  if (topic !== undefined) {
    return {
      ...head,
      description: `Payload of outbox queue "${queue.name}": the events of topic "${topic.topic}", whose schema it shares.`,
      $ref: topicSchemaFileName(topic.topic),
    };
  }
  return {
    ...head,
    description: `Payload of outbox queue "${queue.name}": the event data each relay sends.`,
    ...payloadJsonSchema(queue, "draft-2020-12"),
  };
}

/** A topic's exported schema file: its events' schema, JSON Schema 2020-12, `$id` its file name. */
export function topicSchemaDocument(topic: TopicDefinition<unknown, unknown>): JsonSchema {
  return {
    $schema: DIALECT_2020_12,
    $id: topicSchemaFileName(topic.topic),
    title: topic.topic,
    description: `Events of outbox topic "${topic.topic}": each subscribed queue receives a copy as its payload.`,
    ...topicJsonSchema(topic, "draft-2020-12"),
  };
}

/**
 * `<queue>.schema.json`, with `/` and `:` (allowed in queue names, not in file names everywhere) written as
 * `%2F` and `%3A`: queue names never hold `%`, so two queues never share a file.
 */
export function schemaFileName(queue: string): string {
  return `${fileSafe(queue)}.schema.json`;
}

/**
 * `<topic>.topic.json`, escaped as {@link schemaFileName}. Its own ending, beside the queues' files: a queue
 * file always ends in `.schema.json`, so a topic never shares a file with a queue of the same name (the
 * demo has both an `order.placed` queue and could have an `order.placed` topic), and the file's `$id` stays
 * its name in the same folder, which is what a subscriber's `$ref` resolves against.
 */
export function topicSchemaFileName(topic: string): string {
  return `${fileSafe(topic)}.topic.json`;
}

function fileSafe(name: string): string {
  return name.replaceAll("/", "%2F").replaceAll(":", "%3A");
}

/**
 * The file name of each queue, refusing names that would share a file on a case-insensitive file system
 * (macOS, Windows): `Orders` and `orders` would overwrite each other there. With `kind` "topics", the
 * same for topics' files (which never meet a queue's: see {@link topicSchemaFileName}).
 */
export function schemaFileNames(
  names: readonly string[],
  kind: "queues" | "topics" = "queues",
): Map<string, string> {
  const fileName = kind === "queues" ? schemaFileName : topicSchemaFileName;
  const files = new Map<string, string>();
  const byFolded = new Map<string, string>();
  for (const name of names) {
    const file = fileName(name);
    const other = byFolded.get(file.toLowerCase());
    if (other !== undefined && other !== name) {
      throw new OutboxConfigError(
        kind,
        `${kind} "${other}" and "${name}" differ only in case: their schema files would overwrite each other on a case-insensitive file system`,
      );
    }
    byFolded.set(file.toLowerCase(), name);
    files.set(name, file);
  }
  return files;
}
