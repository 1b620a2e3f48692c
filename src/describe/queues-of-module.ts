import type { z } from "zod";
import { OutboxConfigError } from "../contract/errors.js";
import { type QueueDefinition, validateQueueName } from "../contract/queue.js";
import { type TopicDefinition, validateTopicName, validateTopicPattern } from "../contract/topic.js";

type AnyQueue = QueueDefinition<unknown, unknown>;
type AnyTopic = TopicDefinition<unknown, unknown>;

/** Queue name → the topic names or patterns it subscribes to, each once, in the order declared. */
export type DeclaredSubscriptions = Map<string, string[]>;

/** What a queues module describes: its queues, its topics, and the subscriptions it declares. */
export interface DescribedModule {
  queues: AnyQueue[];
  topics: AnyTopic[];
  subscriptions: DeclaredSubscriptions;
}

/** A zod schema, by shape: the user's module may bring its own copy of zod, so instanceof would miss it. */
function isZodSchema(value: unknown): value is z.ZodType {
  return (
    typeof value === "object" &&
    value !== null &&
    "_zod" in value &&
    typeof (value as { safeParse?: unknown }).safeParse === "function"
  );
}

/** What defineQueue returns: `{ name, schema }`, the schema a zod schema or undefined. */
function isQueueDefinition(value: unknown): value is AnyQueue {
  if (typeof value !== "object" || value === null) return false;
  const { name, schema } = value as { name?: unknown; schema?: unknown };
  return typeof name === "string" && (schema === undefined || isZodSchema(schema)) && "schema" in value;
}

/** What defineTopic returns: `{ topic, schema }`, the schema a zod schema or undefined. */
function isTopicDefinition(value: unknown): value is AnyTopic {
  if (typeof value !== "object" || value === null) return false;
  const { topic, schema } = value as { topic?: unknown; schema?: unknown };
  return typeof topic === "string" && (schema === undefined || isZodSchema(schema)) && "schema" in value;
}

/**
 * A handlers-module entry: a handler function, or `{ handler, schema?, subscribe? }` (what handle()
 * returns; `subscribe` is QueueConfig's, read when present).
 */
function handlerEntry(value: unknown): { schema: z.ZodType | undefined; subscribe: unknown } | undefined {
  if (typeof value === "function") return { schema: undefined, subscribe: undefined };
  if (typeof value !== "object" || value === null) return undefined;
  const { handler, schema, subscribe } = value as {
    handler?: unknown;
    schema?: unknown;
    subscribe?: unknown;
  };
  if (typeof handler !== "function") return undefined;
  return { schema: isZodSchema(schema) ? schema : undefined, subscribe };
}

/** Adds `patterns` (an array of topic names or patterns, or undefined) to `queue`'s, naming `field` if bad. */
function addPatterns(
  into: DeclaredSubscriptions,
  queue: string,
  patterns: unknown,
  field: string,
  file: string,
): void {
  if (patterns === undefined) return;
  if (!Array.isArray(patterns))
    throw new OutboxConfigError("--queues", `${file}: ${field} must be an array of topic names or patterns`);
  const known = into.get(queue) ?? [];
  patterns.forEach((pattern, i) => {
    try {
      validateTopicPattern(pattern, `${field}[${i}]`);
    } catch (error) {
      throw new OutboxConfigError("--queues", `${file}: ${(error as Error).message}`);
    }
    if (!known.includes(pattern)) known.push(pattern);
  });
  into.set(queue, known);
}

/** The queues a module describes: {@link describeModule}'s queues, refusing a module that has none. */
export function queuesOfModule(mod: Record<string, unknown>, file: string): AnyQueue[] {
  const { queues } = describeModule(mod, file);
  if (queues.length === 0) {
    throw new OutboxConfigError(
      "--queues",
      `${file} exports no queue definitions: export defineQueue(...) results (named exports, or an array or object of them), or a handlers map (queue name → handler or handle(queue, fn))`,
    );
  }
  return queues;
}

/**
 * The queues, topics and subscriptions a module describes, in the order found. Accepted, so the module
 * the producer or the service already has can be used as it is:
 * - any export that is a queue definition (`defineQueue(...)`, `subscriberQueue(...)`) or a topic
 *   definition (`defineTopic(...)`), or an array or object of them (an export named `topics`, say);
 * - a handlers module (what `run --handlers` loads): a default (or `queues`) export mapping queue names to a
 *   handler or `handle(queue, fn)` / `{ handler, schema?, subscribe? }` (a bare function: any JSON payload);
 *   an entry's `subscribe` (QueueConfig's) declares that queue's subscriptions;
 * - an export `subscriptions`: queue name → topic names or patterns, as the service config's setting.
 * Throws an OutboxConfigError naming the file when it describes neither a queue nor a topic, when two
 * definitions of one queue or topic have different schemas, or when a subscription is malformed. (Loading
 * the file is the caller's: see src/cli/queues-module.ts.)
 */
export function describeModule(mod: Record<string, unknown>, file: string): DescribedModule {
  const found = new Map<string, AnyQueue>();
  const topics = new Map<string, AnyTopic>();
  const subscriptions: DeclaredSubscriptions = new Map();
  const add = (queue: AnyQueue, where: string) => {
    try {
      validateQueueName(queue.name, where);
    } catch (error) {
      throw new OutboxConfigError("--queues", `${file}: ${(error as Error).message}`);
    }
    const known = found.get(queue.name);
    if (known !== undefined && known.schema !== queue.schema) {
      throw new OutboxConfigError(
        "--queues",
        `${file} defines queue "${queue.name}" twice with different schemas (${where})`,
      );
    }
    found.set(queue.name, queue);
  };
  const addTopic = (topic: AnyTopic, where: string) => {
    try {
      validateTopicName(topic.topic, where);
    } catch (error) {
      throw new OutboxConfigError("--queues", `${file}: ${(error as Error).message}`);
    }
    const known = topics.get(topic.topic);
    if (known !== undefined && known.schema !== topic.schema) {
      throw new OutboxConfigError(
        "--queues",
        `${file} defines topic "${topic.topic}" twice with different schemas (${where})`,
      );
    }
    topics.set(topic.topic, topic);
  };
  for (const [exportName, value] of Object.entries(mod)) {
    if (isQueueDefinition(value)) add(value, exportName);
    else if (isTopicDefinition(value)) addTopic(value, exportName);
    else if (exportName === "subscriptions" && typeof value === "object" && value !== null) {
      for (const [queue, patterns] of Object.entries(value)) {
        try {
          validateQueueName(queue, `subscriptions.${queue}`);
        } catch (error) {
          throw new OutboxConfigError("--queues", `${file}: ${(error as Error).message}`);
        }
        addPatterns(subscriptions, queue, patterns, `subscriptions.${queue}`, file);
      }
    } else if (typeof value === "object" && value !== null) {
      // An object of definitions, or an array (its entries are [index, item]).
      const entries = Object.entries(value);
      for (const [key, item] of entries) {
        if (isQueueDefinition(item)) add(item, `${exportName}.${key}`);
        else if (isTopicDefinition(item)) addTopic(item, `${exportName}.${key}`);
      }
      // Not a record of definitions: a handlers map (queue name → handler), as `run --handlers` reads it.
      if (
        (exportName === "default" || exportName === "queues") &&
        !entries.some(([, v]) => isQueueDefinition(v) || isTopicDefinition(v))
      ) {
        for (const [queue, item] of entries) {
          const entry = handlerEntry(item);
          if (entry === undefined) continue;
          add({ name: queue, schema: entry.schema }, `${exportName}.${queue}`);
          addPatterns(subscriptions, queue, entry.subscribe, `${exportName}.${queue}.subscribe`, file);
        }
      }
    }
  }
  if (found.size === 0 && topics.size === 0) {
    throw new OutboxConfigError(
      "--queues",
      `${file} exports no queue or topic definitions: export defineQueue(...) or defineTopic(...) results (named exports, or an array or object of them), or a handlers map (queue name → handler or handle(queue, fn))`,
    );
  }
  return { queues: [...found.values()], topics: [...topics.values()], subscriptions };
}

/**
 * Declared subscriptions from several places (the module, the service config's `subscriptions`, the
 * relays'), merged: each queue's patterns once, in the order first seen. Records as the config gives them.
 */
export function mergeSubscriptions(
  ...sources: (DeclaredSubscriptions | Readonly<Record<string, readonly string[]>> | undefined)[]
): DeclaredSubscriptions {
  const merged: DeclaredSubscriptions = new Map();
  for (const source of sources) {
    if (source === undefined) continue;
    for (const [queue, patterns] of source instanceof Map ? source : Object.entries(source)) {
      const known = merged.get(queue) ?? [];
      for (const pattern of patterns) if (!known.includes(pattern)) known.push(pattern);
      merged.set(queue, known);
    }
  }
  return merged;
}
