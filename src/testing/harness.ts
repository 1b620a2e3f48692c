/**
 * Runs one queue's handler the way the worker's dispatcher does, minus the database: the same option
 * defaults (resolveWorkerOptions), payload checks (prepareDelivery), failure decisions (decideFailure:
 * error classification, maxAttempts, the retry strategy), timeout error and follow-up collector. Only the
 * waiting is the harness's own: on a {@link Clock} the test can drive.
 */

import { OutboxConfigError } from "../contract/errors.js";
import type { Handler, QueueConfig, ResolvedQueue } from "../contract/handler.js";
import { TOPIC_HEADER, validateTopicName } from "../contract/topic.js";
import { type DecisionRow, decideFailure, prepareDelivery } from "../dispatch/decide-outcome.js";
import { FollowUps, type PreparedFollowUp } from "../dispatch/follow-ups.js";
import { HandlerTimeoutError } from "../dispatch/timeout.js";
import { type ResolvedOptions, resolveWorkerOptions, type WorkerOptions } from "../worker/options.js";
import { type Clock, systemClock } from "./clock.js";
import { TestContext, type TestMessage } from "./context.js";
import type { DeadOutcome, TestFollowUp, TestOutcome } from "./outcome.js";

/**
 * The worker-level settings a queue falls back on, with the worker's defaults (maxAttempts 10,
 * handlerTimeoutMs 300000, exponential backoff, maxDeliveries 25, maxErrorLength 4000).
 */
export interface HarnessOptions
  extends Pick<
    WorkerOptions,
    "retry" | "maxAttempts" | "handlerTimeoutMs" | "maxDeliveries" | "maxErrorLength"
  > {
  /** The queue name the handler sees in `message.queue` (default "test"). */
  queue?: string;
  /** The clock for every run (default the real one); a run's own `clock` wins. */
  clock?: Clock;
}

/** One delivery's message as the test shapes it, and the clock to run it on. */
export interface TestRunOptions extends TestMessage {
  /** This run's clock (default the harness's). */
  clock?: Clock;
}

/**
 * Runs the handler on one payload (the value as published: it is stored as JSON, parsed and validated
 * against the queue's schema like a delivered one) and resolves with what the worker would write.
 */
export type HandlerRun = (payload: unknown, message?: TestRunOptions) => Promise<TestOutcome>;

/**
 * A harness for one queue's handler: a {@link Handler}, or a QueueConfig such as `handle(queue, handler,
 * { maxAttempts, retry, timeoutMs })` makes. Invalid settings throw as `createWorker` would.
 */
export function testHandler<P>(
  config: QueueConfig<P> | Handler<P>,
  options: HarnessOptions = {},
): HandlerRun {
  const name = options.queue ?? "test";
  // The worker's own option parsing, so defaults and refusals (rawPayload with schema, …) cannot drift.
  const worker = resolveWorkerOptions({
    connection: "postgres://handler-test-harness.invalid/",
    workerId: "handler-test-harness",
    logger: false,
    queues: { [name]: config as QueueConfig },
    retry: options.retry,
    maxAttempts: options.maxAttempts,
    handlerTimeoutMs: options.handlerTimeoutMs,
    maxDeliveries: options.maxDeliveries,
    maxErrorLength: options.maxErrorLength,
  });
  const queue = worker.queues.get(name) as ResolvedQueue;
  if (queue.transaction) {
    // Its handler writes through message.transaction: without a database there is nothing to run it on,
    // and a stand-in would prove nothing about what commits with the ack.
    throw new OutboxConfigError(
      `queues.${name}.transaction`,
      "the test harness runs no database: test a transactional handler with a worker on a real Postgres",
    );
  }
  return (payload, message = {}) =>
    runOnce(queue, worker, payload, message, message.clock ?? options.clock ?? systemClock);
}

function stored(payload: unknown): string {
  const text = JSON.stringify(payload);
  // publish refuses these too: a row always holds JSON.
  if (text === undefined)
    throw new OutboxConfigError(
      "payload",
      "not JSON-serialisable",
      "the payload is not JSON-serialisable (undefined)",
    );
  return text;
}

/** Postgres' left(text, n): the database cuts what it stores at n characters (code points). */
function left(text: string, n: number): string {
  return text.length <= n ? text : Array.from(text).slice(0, n).join("");
}

// Synchronous up to the wait: a test may call clock.advance() right after run() and must find the timer set.
function runOnce(
  queue: ResolvedQueue,
  worker: ResolvedOptions,
  payload: unknown,
  message: TestRunOptions,
  clock: Clock,
): Promise<TestOutcome> {
  const attempts = message.attempts ?? 0;
  const createdAt = message.createdAt ?? new Date(clock.now());
  const earlier = attempts === 0 ? null : createdAt;
  const row: DecisionRow = {
    payload: message.rawPayload ?? stored(payload),
    headers:
      message.topic == null
        ? (message.headers ?? {})
        : { ...message.headers, [TOPIC_HEADER]: validateTopicName(message.topic) },
    deliveries_count: message.deliveries ?? attempts + 1,
    attempts_count: attempts,
    failures_count: message.failures ?? attempts,
    first_attempt_at: message.firstAttemptAt === undefined ? earlier : message.firstAttemptAt,
    last_attempt_at: message.lastAttemptAt === undefined ? earlier : message.lastAttemptAt,
  };
  const prepared = prepareDelivery(queue, row, worker);
  if ("dead" in prepared) return Promise.resolve(deadOutcome(prepared.dead, queue, row, worker, undefined));
  const abort = message.abort;
  // A lease lost before the handler started: the worker never runs it.
  if (abort?.aborted) return Promise.resolve({ kind: "lost", reason: abort.reason });

  const controller = new AbortController();
  const followUps = new FollowUps();
  const context = new TestContext(
    {
      id: message.id ?? "1",
      queue: queue.name,
      topic: row.headers[TOPIC_HEADER] ?? null,
      key: message.key ?? null,
      headers: row.headers,
      deliveries: row.deliveries_count,
      attempts,
      createdAt,
      rawPayload: row.payload,
    },
    controller.signal,
    followUps,
  );
  const startedAt = clock.now();

  return new Promise<TestOutcome>((resolve) => {
    const cleanups: (() => void)[] = [];
    let settled = false;
    const done = (outcome: TestOutcome) => {
      if (settled) return;
      settled = true;
      context.seal();
      for (const cleanup of cleanups) cleanup();
      resolve(outcome);
    };
    const fail = (error: unknown) => {
      if (settled) return;
      context.seal();
      done(failureOutcome(queue, worker, row, error, clock));
    };
    const succeed = (result: unknown) => {
      if (settled) return;
      context.seal();
      try {
        // A follow-up the handler returned is validated like a published one: a bad one fails the attempt.
        followUps.addResult(result);
      } catch (error) {
        fail(error);
        return;
      }
      done({
        kind: "acked",
        followUps: followUps.prepared.map(asTestFollowUp),
        durationMs: clock.now() - startedAt,
      });
    };

    if (abort) {
      const onAbort = () => {
        controller.abort(abort.reason);
        done({ kind: "lost", reason: abort.reason });
      };
      abort.addEventListener("abort", onAbort, { once: true });
      cleanups.push(() => abort.removeEventListener("abort", onAbort));
    }
    let result: unknown;
    try {
      result = queue.handler(prepared.payload, context);
    } catch (error) {
      fail(error);
      return;
    }
    // As in the worker, only a promise can time out: a synchronous handler has already returned.
    if (!isThenable(result)) {
      succeed(result);
      return;
    }
    const timeout = new HandlerTimeoutError(queue.timeoutMs);
    cleanups.push(
      clock.setTimeout(
        () => {
          controller.abort(timeout);
          fail(timeout);
        },
        startedAt + queue.timeoutMs - clock.now(),
      ),
    );
    result.then(succeed, fail);
  });
}

function failureOutcome(
  queue: ResolvedQueue,
  worker: ResolvedOptions,
  row: DecisionRow,
  error: unknown,
  clock: Clock,
): TestOutcome {
  const { outcome, problem } = decideFailure(queue, row, error, worker);
  if (outcome.kind === "dead") return deadOutcome(outcome, queue, row, worker, problem);
  return {
    kind: "retried",
    delayMs: outcome.delayMs,
    availableAt: new Date(clock.now() + outcome.delayMs),
    countsTowardsMaxAttempts: outcome.failed === 1,
    transient: outcome.transient,
    timedOut: outcome.timedOut,
    error: left(outcome.error, worker.maxErrorLength),
    attempts: row.attempts_count + 1,
    failures: row.failures_count + outcome.failed,
    ...(problem === undefined ? {} : { strategyProblem: problem }),
  };
}

/** The dead letter the worker's move writes (src/sql/complete.ts): counters plus what this delivery added. */
function deadOutcome(
  dead: { reason: string; error: string | null; attempted: 0 | 1; failed: 0 | 1 },
  queue: ResolvedQueue,
  row: DecisionRow,
  worker: ResolvedOptions,
  problem: string | undefined,
): DeadOutcome {
  return {
    kind: "dead",
    reason: dead.reason,
    error: dead.error === null ? null : left(dead.error, worker.maxErrorLength),
    attempts: row.attempts_count + dead.attempted,
    failures: row.failures_count + dead.failed,
    ...(queue.announceFailures === undefined ? {} : { announced: queue.announceFailures }),
    ...(problem === undefined ? {} : { strategyProblem: problem }),
  };
}

function asTestFollowUp(prepared: PreparedFollowUp): TestFollowUp {
  return {
    queue: prepared.queue,
    payload: JSON.parse(prepared.payloadText),
    key: prepared.key,
    headers: prepared.headers,
    delayMs: prepared.delayMs,
    availableAt: prepared.availableAt,
  };
}

function isThenable(value: unknown): value is PromiseLike<unknown> {
  return (
    value !== null &&
    (typeof value === "object" || typeof value === "function") &&
    typeof (value as { then?: unknown }).then === "function"
  );
}
