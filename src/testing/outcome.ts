import type { FailureAnnouncement } from "../contract/handler.js";
/**
 * What the worker would write for one delivery, as the handler test harness reports it. The counters are
 * the row's after the write (messages for a retry, dead_letters for a dead letter).
 */

/** A follow-up message the handler published or returned, as the consumer of its queue would receive it. */
export interface TestFollowUp {
  /** The queue it is published to. */
  queue: string;
  /** The payload after the queue schema's validation and a JSON round trip, as it would be stored. */
  payload: unknown;
  /** Its ordering key, or null. */
  key: string | null;
  /** Its headers (with the trace context, when tracing is on). */
  headers: Record<string, string>;
  /** Its delay from the ack's transaction, or null. */
  delayMs: number | null;
  /** Its fixed delivery time, or null. */
  availableAt: Date | null;
}

/** The handler returned: the row is deleted and its follow-ups are inserted in the same transaction. */
export interface AckedOutcome {
  kind: "acked";
  /** The follow-ups inserted with the ack, in order. */
  followUps: readonly TestFollowUp[];
  /** How long the handler ran, on the harness's clock. */
  durationMs: number;
}

/** The attempt failed and the message is scheduled again. */
export interface RetriedOutcome {
  kind: "retried";
  /** The backoff the retry strategy chose (whole ms, capped). */
  delayMs: number;
  /** When it becomes due again: the clock's now plus `delayMs`. */
  availableAt: Date;
  /** False for a transient failure: `failures` did not grow, so it does not bring `maxAttempts` closer. */
  countsTowardsMaxAttempts: boolean;
  /** The failure was classified transient (TransientError, network errors). */
  transient: boolean;
  /** The handler ran past its timeout (its signal was aborted with a HandlerTimeoutError). */
  timedOut: boolean;
  /** The error as written to last_error (one line per cause, secrets scrubbed, cut to maxErrorLength). */
  error: string;
  /** The row's attempts_count after the write. */
  attempts: number;
  /** The row's failures_count after the write. */
  failures: number;
  /** Set when the retry strategy threw or returned garbage and the default backoff was used. */
  strategyProblem?: string;
}

/** The message is moved to dead letters. */
export interface DeadOutcome {
  kind: "dead";
  /**
   * The worker's reason: `rejected` (PermanentError), `retries_exhausted` (maxAttempts reached, or the
   * strategy said "stop"), `timeout` (the same, when the last attempt timed out), `invalid_payload`
   * (unparsable, or refused by the queue schema; the handler did not run), `invalid_headers` (a header
   * value that is not a string), `max_deliveries` (deliveries that ended without an outcome).
   */
  reason: string;
  /** The dead letter's error, cut to maxErrorLength as the database stores it. */
  error: string | null;
  /** The dead letter's attempts_count (the handler's attempt counts unless it never ran). */
  attempts: number;
  /** The dead letter's failures_count. */
  failures: number;
  /**
   * Where the move also publishes a failure event, in its transaction: the queue's `announceFailures`
   * (absent when it has none).
   */
  announced?: FailureAnnouncement;
  /** Set when the retry strategy threw or returned garbage and the default backoff was used. */
  strategyProblem?: string;
}

/**
 * The test's `abort` signal fired while the handler ran (the worker lost the lease or gave up at stop):
 * the worker writes nothing, and the message is delivered again once its lease expires.
 */
export interface LostOutcome {
  kind: "lost";
  /** The abort reason. */
  reason: unknown;
}

/** What the worker would do with the delivery. */
export type TestOutcome = AckedOutcome | RetriedOutcome | DeadOutcome | LostOutcome;
