import type { z } from "zod";
import { OutboxConfigError } from "../contract/errors.js";
import { type QueueDefinition, validateQueueName } from "../contract/queue.js";

type AnyQueue = QueueDefinition<unknown, unknown>;

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

/** A handlers-module entry: a handler function, or `{ handler, schema? }` (what handle() returns). */
function handlerEntrySchema(value: unknown): { schema: z.ZodType | undefined } | undefined {
  if (typeof value === "function") return { schema: undefined };
  if (typeof value !== "object" || value === null) return undefined;
  const { handler, schema } = value as { handler?: unknown; schema?: unknown };
  if (typeof handler !== "function") return undefined;
  return { schema: isZodSchema(schema) ? schema : undefined };
}

/**
 * The queues a module describes, in the order found. Accepted, so the module the producer or the service
 * already has can be used as it is:
 * - any export that is a queue definition (`defineQueue(...)`), or an array or object of them;
 * - a handlers module (what `run --handlers` loads): a default (or `queues`) export mapping queue names to a
 *   handler or `handle(queue, fn)` / `{ handler, schema? }` (a bare function: any JSON payload).
 * Throws an OutboxConfigError naming the file when it describes no queue, or when two definitions of one
 * queue name have different schemas. (Loading the file is the caller's: see src/cli/queues-module.ts.)
 */
export function queuesOfModule(mod: Record<string, unknown>, file: string): AnyQueue[] {
  const found = new Map<string, AnyQueue>();
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
  for (const [exportName, value] of Object.entries(mod)) {
    if (isQueueDefinition(value)) add(value, exportName);
    else if (typeof value === "object" && value !== null) {
      // An object of definitions, or an array (its entries are [index, item]).
      const entries = Object.entries(value);
      for (const [key, item] of entries) {
        if (isQueueDefinition(item)) add(item, `${exportName}.${key}`);
      }
      // Not a record of definitions: a handlers map (queue name → handler), as `run --handlers` reads it.
      if (
        (exportName === "default" || exportName === "queues") &&
        !entries.some(([, v]) => isQueueDefinition(v))
      ) {
        for (const [queue, item] of entries) {
          const entry = handlerEntrySchema(item);
          if (entry !== undefined) add({ name: queue, schema: entry.schema }, `${exportName}.${queue}`);
        }
      }
    }
  }
  if (found.size === 0) {
    throw new OutboxConfigError(
      "--queues",
      `${file} exports no queue definitions: export defineQueue(...) results (named exports, or an array or object of them), or a handlers map (queue name → handler or handle(queue, fn))`,
    );
  }
  return [...found.values()];
}
