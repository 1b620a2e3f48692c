/** Per-message options of `publish`. */
export interface PublishOptions {
  /**
   * Ordering key: messages of a queue with the same key are handled one at a time, in publish order. The
   * key's advisory lock is taken before the id and held until your transaction ends: another transaction
   * publishing the same key waits for it, so ids (and delivery) follow commit order.
   */
  key?: string;
  /** Deliver no earlier than this many milliseconds after the producer's transaction started (server clock). */
  delayMs?: number;
  /** Deliver no earlier than this time. Exclusive with `delayMs`. */
  availableAt?: Date;
  /**
   * String headers carried with the message, e.g. a W3C `traceparent`. With `@opentelemetry/api`
   * installed and a propagator registered, the active trace context is added (`traceparent`,
   * `tracestate`…) unless these headers already have a `traceparent`.
   */
  headers?: Record<string, string>;
  /**
   * Never set here: a publish with a dedupe key takes {@link DedupePublishOptions} and answers with a
   * {@link DedupedPublish} instead of an id, so its return type follows from its options.
   */
  dedupeKey?: undefined;
}

/**
 * The options of a publish that is a no-op while a message of the same queue with the same `dedupeKey`
 * is pending (still in the outbox: ready, scheduled, waiting for a retry or being delivered). Not for
 * topics, nor for a handler's follow-ups (both refuse it).
 */
export interface DedupePublishOptions extends Omit<PublishOptions, "dedupeKey"> {
  /**
   * Non-empty text of at most 1024 UTF-8 bytes (no NUL, no lone surrogate). The key is free again once
   * its message leaves the outbox: delivered, dead-lettered or cancelled.
   */
  dedupeKey: string;
}

/** What a publish with a dedupe key did. */
export interface DedupedPublish {
  /** The new message's id, or the pending message's that had the key. */
  id: string;
  /** True when a message with the key was already pending: nothing was written. */
  deduplicated: boolean;
}

/**
 * What `cancel` did: `cancelled` (the pending message is gone, in your transaction), `delivering` (a worker
 * holds it: a live lease, or in leaseMode "transaction" its batch's transaction; it stays, and its handler
 * runs or has run), or `not_found` (no pending message has the key: never published, already delivered, or
 * published by a transaction not yet committed). Never `cancelled` for a message a live worker holds or
 * whose success was recorded.
 */
export type CancelResult =
  | { status: "cancelled"; id: string }
  | { status: "delivering"; id: string }
  | { status: "not_found" };
