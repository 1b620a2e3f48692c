/**
 * The follow-up messages of one delivery: validated and encoded when the handler publishes them (so a bad
 * one fails the handler, and nothing is written), handed to the completer with the ack, and inserted by
 * the ack's own statement under the same lease token. Used by the dispatcher and by the handler test
 * harness, so both accept and refuse exactly the same follow-ups.
 */

import type { FollowUp, PreparedFollowUp } from "../contract/follow-up.js";
import type { HandlerResult } from "../contract/handler.js";
import { DEFAULT_MAX_PAYLOAD_BYTES } from "../contract/payload.js";
import { prepareMessage, refuseFollowUpDedupe, resolveQueue } from "../contract/prepare-message.js";
import type { PublishOptions } from "../contract/publish-options.js";
import type { QueueDefinition } from "../contract/queue.js";

export type { PreparedFollowUp };

export interface FollowUpsOptions {
  /** Larger payloads are refused, as `publish` refuses them (default 256 KiB). */
  maxPayloadBytes?: number;
}

/** A value a handler returned that names a follow-up: an object with its own `queue` and `payload`. */
export function isFollowUp(value: unknown): value is FollowUp {
  return (
    typeof value === "object" &&
    value !== null &&
    Object.hasOwn(value, "queue") &&
    Object.hasOwn(value, "payload")
  );
}

/** Collects one delivery's follow-ups; throws OutboxPayloadError / OutboxConfigError on a bad one. */
export class FollowUps {
  readonly #maxPayloadBytes: number;
  readonly #prepared: PreparedFollowUp[] = [];

  constructor(options: FollowUpsOptions = {}) {
    this.#maxPayloadBytes = options.maxPayloadBytes ?? DEFAULT_MAX_PAYLOAD_BYTES;
  }

  /** What `message.publish` does: validate now, insert with the ack. */
  add<I, O>(queue: QueueDefinition<I, O> | string, payload: I, options?: PublishOptions): void {
    refuseFollowUpDedupe(resolveQueue(queue).name, options);
    this.#prepared.push(prepareMessage(queue, payload, options, this.#maxPayloadBytes));
  }

  /**
   * Add what a handler returned. Before follow-ups existed a handler's return value was ignored, so any
   * value that is not follow-up-shaped (an object with own `queue` and `payload`) is still ignored: a
   * plain-JavaScript handler returning `Promise.all(...)` keeps acking as it did.
   */
  addResult(result: HandlerResult | unknown): void {
    if (result === undefined || result === null) return;
    if (Array.isArray(result)) {
      for (const item of result) if (isFollowUp(item)) this.#addFollowUp(item);
    } else if (isFollowUp(result)) {
      this.#addFollowUp(result);
    }
  }

  #addFollowUp(followUp: FollowUp): void {
    const { queue, payload, ...options } = followUp;
    this.add(queue, payload, options);
  }

  /** The follow-ups so far, in the order they were added (and will get ids). */
  get prepared(): readonly PreparedFollowUp[] {
    return this.#prepared;
  }
}
