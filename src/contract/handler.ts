import type pg from "pg";
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
  /**
   * The open transaction that will also acknowledge this message, for a queue with `transaction: true`
   * (see {@link handleInTransaction}); undefined on other queues. Write through it: what it writes
   * commits together with the ack and the follow-ups, or not at all. It refuses queries once the handler
   * has returned. For Kysely, see {@link transactionKysely}.
   */
  transaction?: TransactionClient | undefined;
}

/**
 * The connection of a transactional handler, inside the transaction that acknowledges its message: pg's
 * `query` (every form), nothing else. Do not send `BEGIN`, `COMMIT` or `ROLLBACK` through it: the worker
 * ends the transaction (savepoints are fine).
 */
export interface TransactionClient {
  /** pg's `ClientBase.query`, on the transaction's connection; throws once the handler has returned. */
  query: pg.ClientBase["query"];
}

/** What a transactional handler gets besides its payload: a {@link MessageContext} whose transaction is open. */
export interface TransactionContext extends MessageContext {
  transaction: TransactionClient;
}

/**
 * A handler that runs inside the transaction acknowledging its message (`message.transaction`): its writes,
 * the ack and the follow-ups commit together, or not at all. See {@link handleInTransaction}.
 */
export type TransactionalHandler<P = unknown> = (
  payload: P,
  message: TransactionContext,
) => Promise<HandlerResult> | HandlerResult;

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
   * the message id. See {@link InboxOptions} and docs/guide/exactly-once.md ("An inbox for handlers with
   * outside effects").
   */
  inbox?: boolean | InboxOptions<P>;
  /**
   * Run the handler inside a Postgres transaction that also acknowledges the message: the handler writes
   * through `message.transaction`, and its writes, the token-fenced ack and the follow-ups commit together
   * or not at all (a crash, a lost lease or a throw leaves none of them). Costs one transaction and one
   * pooled connection held for the handler's whole run per message, instead of batched acks. Prefer
   * {@link handleInTransaction}, which types `message.transaction` as present (default false).
   */
  transaction?: boolean;
  /**
   * Announce this queue's failures: every move of one of its messages to the dead letters also publishes a
   * failure event ({@link FailureEvent}) to the queue or topic named here, in the same transaction as the
   * move, so the event exists if and only if the dead letter does. Not to this queue itself.
   */
  announceFailures?: FailureAnnouncement;
}

/** Where a queue's failures are announced: one queue, or one topic (a copy per subscriber). */
export type FailureAnnouncement = { queue: string } | { topic: string };

/**
 * The payload of a failure event (`QueueConfig.announceFailures`): the dead letter's own data as the move
 * wrote it. Its message is keyless and carries the headers `outbox-failure-of` (the failed message's id)
 * and the failed message's `traceparent` / `tracestate`, when it had them.
 */
export interface FailureEvent {
  /** The failed message's id (its dead letter's id). */
  id: string;
  /** The queue it failed in. */
  queue: string;
  /** The dead-letter reason: `rejected`, `retries_exhausted`, `invalid_payload`, `max_deliveries`, … */
  reason: string;
  /** The error as stored in the dead letter (bounded by `maxErrorLength`), or null. */
  error: string | null;
  /** Handler attempts that ended, this one included. */
  attempts: number;
  /** Times the message was leased. */
  deliveries: number;
  /** The failed message's ordering key. */
  key: string | null;
  /** The failed message's headers. */
  headers: Record<string, string>;
  /** When it was moved (server clock), ISO 8601. */
  failedAt: string;
  /** The topic the failed message was a copy of, for a subscriber's copy. */
  topic?: string;
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
  /** The handler runs inside the ack's transaction (`QueueConfig.transaction`). */
  transaction: boolean;
  announceFailures: FailureAnnouncement | undefined;
  /** Undefined when the queue has no inbox. */
  inbox: ResolvedInbox | undefined;
}
