import { OutboxError } from "../contract/errors.js";
import type { MessageContext } from "../contract/handler.js";
import type { PublishOptions } from "../contract/publish-options.js";
import type { QueueDefinition } from "../contract/queue.js";
import type { FollowUps } from "../dispatch/follow-ups.js";

/** The message a test shapes: every field has a default that reads like a fresh first delivery. */
export interface TestMessage {
  /** Default "1". */
  id?: string;
  /** Default null. */
  key?: string | null;
  /** The topic it was published to, as a subscriber's copy (default null: sent to the queue itself). */
  topic?: string | null;
  /** Default {} (plus `outbox-topic` when `topic` is given, as the database writes it). */
  headers?: Record<string, string>;
  /** Handler attempts that ended before this one (default 0). */
  attempts?: number;
  /** Of those, the ones counted towards maxAttempts (default: all of them, none was transient). */
  failures?: number;
  /** Times the row has been leased, this one included (default attempts + 1). */
  deliveries?: number;
  /** Default: the clock's now. */
  createdAt?: Date;
  /** When the first attempt started, for the retry strategy (default: null before any attempt, else createdAt). */
  firstAttemptAt?: Date | null;
  /** When the previous attempt ended, for the retry strategy (default: null before any attempt, else createdAt). */
  lastAttemptAt?: Date | null;
  /**
   * The stored JSON text (default JSON.stringify(payload)). Postgres' jsonb prints it its own way (a space
   * after `:` and `,`, keys reordered): give the exact text when a raw-payload handler depends on it.
   */
  rawPayload?: string;
  /** Aborting it is the worker losing the lease: the handler's signal aborts and the outcome is "lost". */
  abort?: AbortSignal;
}

/** The handler's {@link MessageContext}; `publish` collects follow-ups as the worker's context does. */
export class TestContext implements MessageContext {
  readonly id: string;
  readonly queue: string;
  readonly topic: string | null;
  readonly key: string | null;
  readonly headers: Record<string, string>;
  readonly deliveries: number;
  readonly attempts: number;
  readonly createdAt: Date;
  readonly rawPayload: string;
  readonly signal: AbortSignal;
  /** The test harness runs no transaction: transactional queues are refused before a context is made. */
  readonly transaction = undefined;
  readonly #followUps: FollowUps;
  #sealed = false;

  constructor(
    fields: Omit<MessageContext, "publish" | "signal" | "transaction">,
    signal: AbortSignal,
    followUps: FollowUps,
  ) {
    this.id = fields.id;
    this.queue = fields.queue;
    this.topic = fields.topic;
    this.key = fields.key;
    this.headers = fields.headers;
    this.deliveries = fields.deliveries;
    this.attempts = fields.attempts;
    this.createdAt = fields.createdAt;
    this.rawPayload = fields.rawPayload;
    this.signal = signal;
    this.#followUps = followUps;
  }

  publish<I, O>(queue: QueueDefinition<I, O> | string, payload: I, options?: PublishOptions): void {
    // As the worker's context: once the outcome is decided, a late publish would ride no write.
    if (this.#sealed) throw new OutboxError("message.publish called after the handler returned");
    this.#followUps.add(queue, payload, options);
  }

  /** The handler's outcome is being decided: no more follow-ups. */
  seal(): void {
    this.#sealed = true;
  }
}
