import type { z } from "zod";
import { OutboxConfigError } from "./errors.js";

/** A queue and the shape of its payloads. The schema checks payloads at publish and again at delivery. */
export interface QueueDefinition<Input = unknown, Output = Input> {
  /** The queue's name: letters, digits and `. _ : / -`, at most 200 bytes. */
  readonly name: string;
  /** The zod schema of its payloads; undefined for any JSON value. */
  readonly schema: z.ZodType<Output, Input> | undefined;
}

// Queue names travel as NOTIFY payloads and metric labels: keep them short and printable.
const QUEUE_NAME = /^[A-Za-z0-9][A-Za-z0-9._:/-]*$/;
export const MAX_QUEUE_NAME_BYTES = 200;

export function validateQueueName(name: unknown, field = "queue"): string {
  if (typeof name !== "string" || name.length === 0)
    throw new OutboxConfigError(field, "must be a non-empty string");
  if (Buffer.byteLength(name) > MAX_QUEUE_NAME_BYTES) {
    throw new OutboxConfigError(
      field,
      `"${name.slice(0, 40)}…" is longer than ${MAX_QUEUE_NAME_BYTES} bytes`,
    );
  }
  if (!QUEUE_NAME.test(name)) {
    throw new OutboxConfigError(
      field,
      `${JSON.stringify(name)} may only hold letters, digits and . _ : / - (starting with a letter or digit)`,
    );
  }
  return name;
}
