import { z } from "zod";
import { OutboxConfigError } from "../contract/errors.js";
import type { QueueDefinition } from "../contract/queue.js";

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
  if (queue.schema === undefined) return {};
  let schema: JsonSchema;
  try {
    schema = z.toJSONSchema(queue.schema as z.ZodType, {
      io: "output",
      target: dialect === "draft-07" ? "draft-7" : "draft-2020-12",
      unrepresentable: "throw",
    }) as JsonSchema;
  } catch (error) {
    throw new OutboxConfigError(
      `queue "${queue.name}"`,
      `its zod schema cannot be written as JSON Schema: ${(error as Error).message}; describe what is stored instead (e.g. z.iso.datetime() rather than z.date(), no .transform())`,
    );
  }
  // The dialect is the document's business (the file's $schema, AsyncAPI's own): not each payload's.
  const { $schema: _, ...rest } = schema;
  return rest;
}

/** A queue's exported schema file: the payload schema named for the queue, JSON Schema 2020-12. */
export function queueSchemaDocument(queue: QueueDefinition<unknown, unknown>): JsonSchema {
  return {
    $schema: "https://json-schema.org/draft/2020-12/schema",
    $id: schemaFileName(queue.name),
    title: queue.name,
    description: `Payload of outbox queue "${queue.name}": the event data each relay sends.`,
    ...payloadJsonSchema(queue, "draft-2020-12"),
  };
}

/**
 * `<queue>.schema.json`, with `/` and `:` (allowed in queue names, not in file names everywhere) written as
 * `%2F` and `%3A`: queue names never hold `%`, so two queues never share a file.
 */
export function schemaFileName(queue: string): string {
  return `${queue.replaceAll("/", "%2F").replaceAll(":", "%3A")}.schema.json`;
}

/**
 * The file name of each queue, refusing names that would share a file on a case-insensitive file system
 * (macOS, Windows): `Orders` and `orders` would overwrite each other there.
 */
export function schemaFileNames(queues: readonly string[]): Map<string, string> {
  const files = new Map<string, string>();
  const byFolded = new Map<string, string>();
  for (const queue of queues) {
    const file = schemaFileName(queue);
    const other = byFolded.get(file.toLowerCase());
    if (other !== undefined && other !== queue) {
      throw new OutboxConfigError(
        "queues",
        `queues "${other}" and "${queue}" differ only in case: their schema files would overwrite each other on a case-insensitive file system`,
      );
    }
    byFolded.set(file.toLowerCase(), queue);
    files.set(queue, file);
  }
  return files;
}
