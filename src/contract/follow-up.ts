import type { PublishOptions } from "../produce/publisher.js";
import type { QueueDefinition } from "../produce/queue.js";

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
