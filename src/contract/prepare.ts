import { z } from "zod";
import { withTraceContext } from "../util/tracing.js";
import { OutboxPayloadError } from "./errors.js";
import type { PreparedFollowUp } from "./follow-up.js";
import { encodePayload } from "./payload.js";
import type { PublishOptions } from "./publish-options.js";
import { type QueueDefinition, validateQueueName } from "./queue.js";

/**
 * Validation shared by `publish` and follow-up messages, so a follow-up is refused for exactly the
 * reasons a publish would be, and before anything is written.
 */

const publishOptionsSchema = z
  .strictObject({
    key: z.string().min(1).max(1024).optional(),
    delayMs: z.number().finite().min(0).optional(),
    availableAt: z
      .date()
      .refine((d) => !Number.isNaN(d.getTime()), "must be a valid Date")
      .optional(),
    headers: z.record(z.string(), z.string()).optional(),
  })
  .refine((o) => o.delayMs === undefined || o.availableAt === undefined, {
    message: "give delayMs or availableAt, not both",
    path: ["availableAt"],
  });

/** Publish options after validation. */
export type CheckedPublishOptions = z.output<typeof publishOptionsSchema>;

function describeIssues(error: z.ZodError): string {
  return error.issues.map((i) => `${i.path.join(".") || "(options)"}: ${i.message}`).join("; ");
}

/** A queue given by name or by definition, as a definition (the name validated). */
export function resolveQueue<I, O>(queue: QueueDefinition<I, O> | string): QueueDefinition<I, O> {
  if (typeof queue === "string") return { name: validateQueueName(queue), schema: undefined };
  return queue;
}

/** Validates per-message options; throws OutboxPayloadError naming the queue. */
export function checkPublishOptions(queue: string, opts: PublishOptions | undefined): CheckedPublishOptions {
  const result = publishOptionsSchema.safeParse(opts ?? {});
  if (!result.success)
    throw new OutboxPayloadError(queue, `invalid options: ${describeIssues(result.error)}`);
  return result.data;
}

/** One message validated and encoded, ready to insert. */
export type PreparedMessage = PreparedFollowUp;

/**
 * Validate and encode one message exactly as `publish` does (queue name, options, schema, size). The
 * trace context is injected only if tracing was already loaded: this is synchronous, and the worker
 * loads it before its first handler runs.
 */
export function prepareMessage<I, O>(
  queueRef: QueueDefinition<I, O> | string,
  payload: I,
  opts: PublishOptions | undefined,
  maxPayloadBytes: number,
): PreparedMessage {
  const queue = resolveQueue(queueRef);
  const o = checkPublishOptions(queue.name, opts);
  const payloadText = encodePayload(queue as QueueDefinition, payload, maxPayloadBytes);
  const prepared = {
    queue: queue.name,
    payloadText,
    key: o.key ?? null,
    headers: withTraceContext(o.headers) ?? {},
    delayMs: o.delayMs ?? null,
    availableAt: o.availableAt ?? null,
  };
  const refused = insertRefusal(prepared);
  if (refused) throw new OutboxPayloadError(queue.name, refused);
  return prepared;
}

/**
 * JSON text jsonb refuses: an escaped NUL, or an escaped surrogate (JSON.stringify escapes only lone ones,
 * which jsonb cannot store), after an even number of backslashes.
 */
const UNSTORABLE = /(?:^|[^\\])(?:\\\\)*\\u(?:0000|[dD][89a-fA-F][0-9a-fA-F]{2})/;
/** Far enough for any schedule, near enough that `now() + delay` stays a valid timestamptz. */
const MAX_DELAY_MS = 1e14;
/** Postgres timestamptz runs from 4713 BC to 294276 AD; JavaScript dates reach further back. */
const MIN_YEAR = -4712;

/**
 * What Postgres would refuse at insert time, found now. A publish that fails its insert fails the
 * caller's own transaction; a follow-up that failed its insert would fail its ack's whole batch (other
 * handlers' acks included) again on every retry, so it must fail its handler instead.
 */
function insertRefusal(m: PreparedMessage): string | undefined {
  if (UNSTORABLE.test(m.payloadText))
    return "payload holds a NUL character or a lone surrogate: jsonb cannot store it";
  if (m.key?.includes("\0")) return "key holds a NUL character";
  if (UNSTORABLE.test(JSON.stringify(m.headers)))
    return "headers hold a NUL character or a lone surrogate: jsonb cannot store them";
  if (m.delayMs !== null && m.delayMs > MAX_DELAY_MS) return `delayMs ${m.delayMs} is beyond any valid time`;
  if (m.availableAt !== null && m.availableAt.getUTCFullYear() < MIN_YEAR)
    return "availableAt is before 4713 BC";
  return undefined;
}
