import type { PublishOptions } from "./publish-options.js";
import type { QueueDefinition } from "./queue.js";

/**
 * A message a handler publishes as part of its own success: inserted in the same transaction as the
 * handler's ack and guarded by the same lease token, so it exists exactly once or not at all.
 */
export interface FollowUp<I = unknown, O = I> extends PublishOptions {
  readonly queue: QueueDefinition<I, O> | string;
  readonly payload: I;
}

/** Build a {@link FollowUp} for a handler to return (one, or an array of them). */
export function followUp<I, O>(
  queue: QueueDefinition<I, O> | string,
  payload: I,
  options: PublishOptions = {},
): FollowUp<I, O> {
  return { ...options, queue, payload };
}

/**
 * A follow-up validated and encoded, ready to insert with its parent's ack: plain data, no class, so the
 * lease store can write it and a test harness can inspect it. `delayMs` counts from the ack's transaction
 * on the server clock, like a publish's.
 */
export interface PreparedFollowUp {
  readonly queue: string;
  /** The payload's JSON text (the queue schema's output), within the size limit. */
  readonly payloadText: string;
  readonly key: string | null;
  /** Caller headers plus the active trace context (when tracing is loaded). */
  readonly headers: Record<string, string>;
  /** Null when not given. */
  readonly delayMs: number | null;
  readonly availableAt: Date | null;
}

/**
 * The dead-letter reason of a message whose handler returned follow-ups the worker's role may not insert
 * (granted without `--worker-can-follow-up`): dead-lettered at once, rather than left to cycle through
 * lease expiry until max_deliveries. Grant the option, then replay it (its handler runs again).
 */
export const FOLLOW_UPS_REFUSED = "follow_ups_refused";
