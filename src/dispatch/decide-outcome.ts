/**
 * The dispatcher's decisions that depend only on the message and the queue's settings: whether a delivery
 * may run and with what payload, and what a failed attempt becomes. Pure, so the handler test harness
 * (src/testing) reaches the same verdicts by calling these very functions.
 */

import type { ResolvedQueue } from "../contract/handler.js";
import { classifyError, errorMessage } from "../contract/handler-errors.js";
import type { OutcomeOf } from "../lease/outcome.js";
import { decide, defaultRetry, type RetryStrategy } from "../retry/strategies.js";
import { isHandlerTimeout } from "./timeout.js";

/** What a dead-letter write needs, without the delivery it is for. */
export type DeadDecision = Omit<OutcomeOf<"dead">, "held">;
/** What a retry write needs, without the delivery it is for. */
export type RetryDecisionOutcome = Omit<OutcomeOf<"retry">, "held">;

/** The row columns the decisions read (a leased row has them all). */
export interface DecisionRow {
  payload: string;
  headers: Record<string, string>;
  deliveries_count: number;
  attempts_count: number;
  failures_count: number;
  first_attempt_at: Date | null;
  last_attempt_at: Date | null;
}

/** A delivery refused before its handler runs: dead-lettered without counting an attempt. */
function refused(reason: string, error: string | null): { dead: DeadDecision } {
  return { dead: { kind: "dead", reason, error, attempted: 0, failed: 0 } };
}

/**
 * Deliveries of a row that ended with no outcome written, counting the one starting now: every lease bumps
 * `deliveries_count`, every recorded attempt bumps `attempts_count`.
 */
export function unrecordedDeliveries(row: Pick<DecisionRow, "deliveries_count" | "attempts_count">): number {
  return row.deliveries_count - row.attempts_count;
}

/** The first header whose value is not a string, if any. */
function nonStringHeader(headers: Record<string, unknown>): string | undefined {
  for (const name in headers) if (typeof headers[name] !== "string") return name;
  return undefined;
}

/**
 * Before the handler: refuse a crash loop (max deliveries), then parse and validate the stored payload.
 * Raw queues (relays) get the stored text as it is: no parse, so no digit of a big number is lost.
 */
export function prepareDelivery(
  queue: Pick<ResolvedQueue, "rawPayload" | "schema">,
  row: Pick<DecisionRow, "payload" | "deliveries_count" | "attempts_count" | "headers">,
  limits: { maxDeliveries: number; maxErrorLength: number },
): { dead: DeadDecision } | { payload: unknown } {
  // The crash-loop guard: a row whose deliveries keep ending without a recorded outcome (its worker died,
  // lost the lease, or stopped past its timeout) must not run again. Every recorded attempt (a retry,
  // transient or not) is subtracted, so an outage of any length is retried and never lands here.
  const unrecorded = unrecordedDeliveries(row);
  if (unrecorded > limits.maxDeliveries) {
    return refused(
      "max_deliveries",
      `leased ${row.deliveries_count} times, ${unrecorded - 1} of them ended without an outcome (max ${limits.maxDeliveries})`,
    );
  }
  // A CHECK keeps headers an object, not its values strings: a plain-SQL producer can store any JSON there,
  // which every consumer of `message.headers` (relays, tracing) would trip over.
  const badHeader = nonStringHeader(row.headers);
  if (badHeader !== undefined) {
    return refused(
      "invalid_headers",
      `header ${JSON.stringify(badHeader.slice(0, 200))} is not a string (headers are a map of strings)`,
    );
  }
  if (queue.rawPayload) return { payload: row.payload };
  let payload: unknown;
  try {
    payload = JSON.parse(row.payload);
  } catch (error) {
    // jsonb's own output always parses; a failure here must still end as a dead letter, not a dead loop.
    return refused("invalid_payload", errorMessage(error, limits.maxErrorLength));
  }
  if (!queue.schema) return { payload };
  const parsed = queue.schema.safeParse(payload);
  if (!parsed.success) {
    const problems = parsed.error.issues.map((i) => `${i.path.join(".") || "(payload)"}: ${i.message}`);
    return refused("invalid_payload", problems.join("; "));
  }
  return { payload: parsed.data };
}

/**
 * What a failed attempt becomes: a PermanentError dead-letters at once (rejected); a failure that reaches
 * `maxAttempts` dead-letters (retries_exhausted, or timeout when the last attempt timed out); otherwise
 * the retry strategy (the queue's, else the worker's, else the default) picks the delay or "stop".
 * Transient errors are retried without counting towards `maxAttempts`. `problem`: the strategy returned
 * something unusable and the default delay was used (for the caller to log).
 */
export function decideFailure(
  queue: Pick<ResolvedQueue, "retry" | "maxAttempts">,
  row: Omit<DecisionRow, "payload" | "deliveries_count">,
  error: unknown,
  worker: { retry?: RetryStrategy | undefined; maxErrorLength: number },
): { outcome: DeadDecision | RetryDecisionOutcome; problem?: string } {
  const message = errorMessage(error, worker.maxErrorLength);
  const kind = classifyError(error);
  if (kind === "permanent") {
    return { outcome: { kind: "dead", reason: "rejected", error: message, attempted: 1, failed: 1 } };
  }
  const timedOut = isHandlerTimeout(error);
  const exhausted = timedOut ? "timeout" : "retries_exhausted";
  const failed = kind === "transient" ? 0 : 1;
  const failures = row.failures_count + failed;
  if (failed && failures >= queue.maxAttempts) {
    return { outcome: { kind: "dead", reason: exhausted, error: message, attempted: 1, failed: 1 } };
  }
  const { decision, problem } = decide(queue.retry ?? worker.retry ?? defaultRetry, {
    attempts: row.attempts_count + 1,
    failures,
    firstAttemptAt: row.first_attempt_at,
    lastAttemptAt: row.last_attempt_at,
    error,
  });
  const outcome: DeadDecision | RetryDecisionOutcome =
    decision === "stop"
      ? { kind: "dead", reason: exhausted, error: message, attempted: 1, failed }
      : {
          kind: "retry",
          delayMs: decision,
          error: message,
          failed,
          transient: kind === "transient",
          timedOut,
        };
  return problem === undefined ? { outcome } : { outcome, problem };
}
