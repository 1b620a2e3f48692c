import { OutboxPayloadError } from "./errors.js";
import type { QueueDefinition } from "./queue.js";

export const DEFAULT_MAX_PAYLOAD_BYTES = 256 * 1024;

/** Validate a payload against its queue's schema and serialise it; throws before anything is written. */
export function encodePayload(queue: QueueDefinition, payload: unknown, maxBytes: number): string {
  let value = payload;
  if (queue.schema) {
    const parsed = queue.schema.safeParse(payload);
    if (!parsed.success) {
      const problems = parsed.error.issues
        .map((issue) => `${issue.path.length ? issue.path.join(".") : "(payload)"}: ${issue.message}`)
        .join("; ");
      throw new OutboxPayloadError(queue.name, `invalid payload: ${problems}`);
    }
    value = parsed.data;
  }
  let json: string | undefined;
  try {
    json = JSON.stringify(value);
  } catch (error) {
    throw new OutboxPayloadError(queue.name, `payload is not JSON-serialisable: ${(error as Error).message}`);
  }
  if (json === undefined)
    throw new OutboxPayloadError(queue.name, "payload is not JSON-serialisable (undefined)");
  const bytes = Buffer.byteLength(json);
  if (bytes > maxBytes) {
    throw new OutboxPayloadError(
      queue.name,
      `payload is ${bytes} bytes, over the maximum of ${maxBytes} bytes`,
    );
  }
  return json;
}
