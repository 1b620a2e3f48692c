import { OutboxPayloadError } from "./errors.js";
import { fieldPath } from "./field-path.js";
import { jsonProblem } from "./json-problems.js";
import type { QueueDefinition } from "./queue.js";

export const DEFAULT_MAX_PAYLOAD_BYTES = 256 * 1024;

/**
 * Validate a payload against its queue's schema and serialise it, refusing what jsonb could not store
 * (NUL, lone surrogates) or JSON would silently turn into null (NaN, ±Infinity); throws before anything is
 * written, naming the field.
 */
export function encodePayload(queue: QueueDefinition, payload: unknown, maxBytes: number): string {
  let value = payload;
  if (queue.schema) {
    const parsed = queue.schema.safeParse(payload);
    if (!parsed.success) {
      const problems = parsed.error.issues
        .map((issue) => `${issue.path.length ? issue.path.join(".") : "(payload)"}: ${issue.message}`)
        .join("; ");
      throw new OutboxPayloadError(queue.name, `invalid payload: ${problems}`, {
        field: fieldPath("payload", parsed.error.issues[0]?.path ?? []),
      });
    }
    value = parsed.data;
  }
  let json: string | undefined;
  try {
    json = JSON.stringify(value);
  } catch (error) {
    throw new OutboxPayloadError(
      queue.name,
      `payload is not JSON-serialisable: ${(error as Error).message}`,
      {
        field: "payload",
      },
    );
  }
  if (json === undefined)
    throw new OutboxPayloadError(queue.name, "payload is not JSON-serialisable (undefined)", {
      field: "payload",
    });
  const found = jsonProblem(value, json, "payload");
  if (found)
    throw new OutboxPayloadError(queue.name, `${found.field}: ${found.problem}`, { field: found.field });
  const bytes = Buffer.byteLength(json);
  if (bytes > maxBytes) {
    throw new OutboxPayloadError(
      queue.name,
      `payload is ${bytes} bytes, over the maximum of ${maxBytes} bytes`,
      { field: "payload" },
    );
  }
  return json;
}
