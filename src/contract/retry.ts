/** What a {@link RetryStrategy} knows about the failed attempt. */
export interface RetryContext {
  /** Attempts that ended so far, including the one that just failed (>= 1). */
  attempts: number;
  /** Failures counted towards maxAttempts; transient ones are excluded (>= 0). */
  failures: number;
  /** When the first attempt started (server clock). */
  firstAttemptAt: Date | null;
  /** When the attempt that just failed started. */
  lastAttemptAt: Date | null;
  /** What the handler threw. */
  error: unknown;
}

/** A delay in ms, or "stop" to dead-letter now. */
export type RetryDecision = number | "stop";

/**
 * Decides when a failed message is tried again. Use {@link exponential} (the default), {@link linear},
 * {@link constant}, {@link none} or your own function; one that throws or returns garbage gets the default
 * delay instead.
 */
export type RetryStrategy = (ctx: RetryContext) => RetryDecision;
