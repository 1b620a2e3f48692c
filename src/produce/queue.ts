import type { z } from "zod";
import { type QueueDefinition, validateQueueName } from "../contract/queue.js";

/** Define a typed queue: `publish` accepts the schema's input type and stores its output. */
export function defineQueue<S extends z.ZodType>(
  name: string,
  schema: S,
): QueueDefinition<z.input<S>, z.output<S>>;
/** Define a queue whose payloads are any JSON value. */
export function defineQueue(name: string): QueueDefinition<unknown, unknown>;
export function defineQueue(name: string, schema?: z.ZodType): QueueDefinition {
  return { name: validateQueueName(name), schema };
}
