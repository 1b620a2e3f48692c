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
}
