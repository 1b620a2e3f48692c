import type { z } from "zod";
import type { FollowUp } from "./follow-up.js";
import type { InboxOptions, ResolvedInbox } from "./inbox.js";
import type { PublishOptions } from "./publish-options.js";
import type { QueueDefinition } from "./queue.js";
import type { RetryStrategy } from "./retry.js";

/** What a handler gets besides its payload. */
export interface MessageContext {
  id: string;
  queue: string;
  /**
   * The topic this message was published to, when it is a subscriber's copy of an event (also in
   * `headers["outbox-topic"]`); null for a message published to the queue itself.
   */
  topic: string | null;
  key: string | null;
  headers: Record<string, string>;
  /** Times this row has been leased, this one included (crash re-claims count). */
  deliveries: number;
  /** Handler attempts that ended before this one. */
  attempts: number;
  createdAt: Date;
  /**
   * The payload exactly as stored (jsonb's JSON text). Read it when numbers may exceed 2^53: the parsed
   * payload holds them as doubles, this text holds every digit.
   */
  rawPayload: string;
  /**
   * Fires when the handler's timeout passes, the worker's stop timeout passes, or this worker lost the
   * lease: stop work, nothing will be saved.
   */
  signal: AbortSignal;
  /**
   * Publish a follow-up message atomically with this message's ack: it is validated now and inserted in
   * the ack's transaction, under the same lease token, only if the handler succeeds and the ack lands.
   * A retried or dead-lettered delivery publishes nothing. Same as returning {@link followUp}s.
   */
  publish<I, O>(queue: QueueDefinition<I, O> | string, payload: I, options?: PublishOptions): void;
}

/** What a handler may return: nothing, or follow-up messages to insert with its ack. */
// biome-ignore lint/suspicious/noConfusingVoidType: `void` keeps handlers typed `() => Promise<void>` assignable.
export type HandlerResult = void | undefined | FollowUp | readonly FollowUp[];

/**
 * Delivers one message. Returning acknowledges it (with any {@link FollowUp}s returned or published
 * through `message.publish`, inserted in the ack's transaction); throwing retries it (a
 * {@link PermanentError} dead-letters it at once, a {@link TransientError} retries it without counting
 * towards `maxAttempts`).
 */
export type Handler<P = unknown> = (
  payload: P,
  message: MessageContext,
) => Promise<HandlerResult> | HandlerResult;

/** One queue's handler and its per-queue settings, in `WorkerOptions.queues` (see {@link handle}). */
export interface QueueConfig<P = unknown> {
  handler: Handler<P>;
  /** Validates (and types) payloads at delivery; a payload that fails goes to dead letters as invalid_payload. */
  schema?: z.ZodType<P>;
  /** This queue's retry strategy (overrides the worker's `retry`). */
  retry?: RetryStrategy;
  /** Failures (transient ones excluded) after which a message is dead-lettered as retries_exhausted. */
  maxAttempts?: number;
  /** This queue's handler timeout (overrides the worker's `handlerTimeoutMs`). */
  timeoutMs?: number;
  /**
   * Hand the handler the stored JSON text as its payload, unparsed and unvalidated (the built-in relays
   * do: bytes in, bytes out, and no parse per message). Not with `schema`.
   */
  rawPayload?: boolean;
  /**
   * Messages with the same key are handled one at a time, in id order, across every worker (default true).
   * false makes the key plain metadata: this queue's keyed messages run in parallel like keyless ones.
   */
  ordered?: boolean;
  /**
   * Topic names or patterns (`order.placed`, `order.*`, `order.#`) this queue subscribes to: `worker.start()`
   * subscribes it to each one it is not subscribed to yet, before it fetches, so events published to a
   * matching topic after that get a copy in this queue. Add-only: removing a pattern from this list does
   * not unsubscribe (`outbox-worker unsubscribe` or `unsubscribe()` does). The worker's role needs the
   * right to change subscriptions (`outbox-worker grant --worker-can-subscribe`).
   */
  subscribe?: readonly string[];
  /**
   * Dedupe this queue's deliveries with the worker inbox (for handlers with effects outside this database):
   * a message whose record exists is acked without running the handler (outcome `deduped`); after the
   * handler succeeds, the record is committed before the ack. `true`: consumer = the queue's name, key =
   * the message id. See {@link InboxOptions} and the README's "An inbox for handlers with outside effects".
   */
  inbox?: boolean | InboxOptions<P>;
}

/** A queue's {@link QueueConfig} with every default filled in, as the dispatcher uses it. */
export interface ResolvedQueue {
  name: string;
  handler: Handler;
  schema: z.ZodType | undefined;
  retry: RetryStrategy | undefined;
  maxAttempts: number;
  timeoutMs: number;
  rawPayload: boolean;
  ordered: boolean;
  /** Undefined when the queue has no inbox. */
  inbox: ResolvedInbox | undefined;
}
