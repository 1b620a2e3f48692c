/**
 * N dispatch loops drain the local queue. Per row: refuse crash loops (max deliveries), parse and validate
 * the payload, run the handler with an AbortSignal and a timeout, and turn what happened into one outcome
 * for the completer.
 */

import { OutboxConfigError, OutboxError } from "../contract/errors.js";
import { FOLLOW_UPS_REFUSED } from "../contract/follow-up.js";
import type { MessageContext, ResolvedQueue, TransactionClient } from "../contract/handler.js";
import { TransientError } from "../contract/handler-errors.js";
import { type InboxRecord, type InboxStore, MAX_INBOX_KEY_LENGTH } from "../contract/inbox.js";
import type { PublishOptions } from "../contract/publish-options.js";
import type { QueueDefinition } from "../contract/queue.js";
import { TOPIC_HEADER } from "../contract/topic.js";
import {
  abortHeld,
  confirmedNow,
  type HeldRow,
  heldSignal,
  lose,
  startCompleting,
  startRunning,
} from "../lease/held.js";
import type { Outcome, OutcomeOf } from "../lease/outcome.js";
import { followUpsRefused, type LeaseTransaction, type RowFate } from "../lease/store.js";
import type { RetryStrategy } from "../retry/strategies.js";
import {
  endProcessSpan,
  loadTracing,
  type ProcessSpan,
  runInSpan,
  startProcessSpan,
  tracingLoaded,
} from "../util/tracing.js";
import { commitWithAck, handlerClient } from "./ack-transaction.js";
import { decideFailure, prepareDelivery } from "./decide-outcome.js";
import { FollowUps, isFollowUp } from "./follow-ups.js";
import type { LocalQueue } from "./local-queue.js";
import { HandlerTimeoutError } from "./timeout.js";

export interface DispatcherDeps {
  queue: LocalQueue<HeldRow>;
  concurrency: number;
  queues: Map<string, ResolvedQueue>;
  maxDeliveries: number;
  retry: RetryStrategy | undefined;
  maxErrorLength: number;
  submit(outcome: Outcome): void;
  /** The inbox of queues configured with one; undefined when no queue has one (nothing is asked). */
  inbox?: Pick<InboxStore, "seen">;
  dispatched(held: HeldRow): void;
  /**
   * A queued delivery whose confirmation ran out (`validUntil` passed: the process was frozen, or renewals
   * failed): ask the database again → whether it is still ours. False: it was dropped (not started).
   */
  confirm(held: HeldRow): Promise<boolean>;
  /** A retry strategy returned something unusable; the default was used instead. */
  strategyProblem(held: HeldRow, problem: string): void;
  /**
   * A handler ran past its timeout: its signal was aborted and its slot freed. `stillRunning` counts the
   * timed-out handlers whose promise has not settled yet (they ignore their signal).
   */
  timedOut(held: HeldRow, timeoutMs: number, stillRunning: number): void;
  /**
   * For queues with `transaction: true`: a transaction on a connection of its own, in which the handler
   * runs and its ack is written. Absent (a store without a database): such queues are refused at start.
   */
  transactions?: {
    begin(): Promise<LeaseTransaction>;
    whereabouts(held: HeldRow): Promise<RowFate>;
    /** An ack in a handler's transaction committed: report it as a landed batched ack is reported. */
    landed(outcome: OutcomeOf<"ack">): void;
    /** Its row was under another token: rolled back; report it as a batched ack's lost lease. */
    lost(outcome: OutcomeOf<"ack">): void;
    /** A try of the ack found its key busy (a producer has not committed): waited for, in the transaction. */
    busy?(held: HeldRow): void;
  };
}

/** A handler in progress: when it times out, and how to stop waiting for it. */
interface Running {
  deadline: number;
  timeoutMs: number;
  /** Settles the dispatch loop's wait with a timeout; set while an async handler is awaited. */
  expire: ((error: HandlerTimeoutError) => void) | undefined;
  expired: boolean;
}

/** A class, not an object literal with a getter: one shared shape for every message's context. */
class Context implements MessageContext {
  readonly id: string;
  readonly queue: string;
  readonly key: string | null;
  readonly headers: Record<string, string>;
  readonly deliveries: number;
  readonly attempts: number;
  readonly #held: HeldRow;
  #createdAt: Date | undefined;

  constructor(held: HeldRow) {
    const { row } = held;
    this.id = row.id;
    this.queue = row.queue;
    this.key = row.key;
    this.headers = row.headers;
    this.deliveries = row.deliveries_count;
    this.attempts = row.attempts_count;
    this.#held = held;
  }

  /** Made on first publish: most deliveries have none, and pay nothing for the feature. */
  followUps: FollowUps | undefined;

  /** The handler's transaction (transactional queues only), closed when the handler has returned. */
  transaction: TransactionClient | undefined;

  publish<I, O>(queue: QueueDefinition<I, O> | string, payload: I, options?: PublishOptions): void {
    // After the handler settled (a late call from a timed-out or fire-and-forget task) the outcome is
    // already decided: a follow-up added now would ride a later write or none. Refuse it loudly instead.
    if (this.#sealed) throw new OutboxError("message.publish called after the handler returned");
    this.followUps ??= new FollowUps();
    this.followUps.add(queue, payload, options);
  }

  #sealed = false;

  /** Adds what the handler returned (values that are not follow-ups are ignored, as before them). */
  returned(value: unknown): void {
    if (!Array.isArray(value) && !isFollowUp(value)) return;
    this.followUps ??= new FollowUps();
    this.followUps.addResult(value);
  }

  /** The handler's outcome is being decided: no more follow-ups. */
  seal(): void {
    this.#sealed = true;
  }

  /** Whether the handler may still use its transaction. */
  get sealed(): boolean {
    return this.#sealed;
  }

  /** Made on first read: most handlers never look at it. */
  get createdAt(): Date {
    this.#createdAt ??= new Date(this.#held.row.created_epoch * 1000);
    return this.#createdAt;
  }

  get rawPayload(): string {
    return this.#held.row.payload;
  }

  /** The topic this copy was published to (its reserved header), or null for a message sent to the queue. */
  get topic(): string | null {
    return this.headers[TOPIC_HEADER] ?? null;
  }

  get signal(): AbortSignal {
    return heldSignal(this.#held);
  }

  /** Getters live on the prototype; logging or JSON.stringify of a context still shows createdAt. */
  toJSON() {
    const { id, queue, topic, key, headers, deliveries, attempts, createdAt } = this;
    return { id, queue, topic, key, headers, deliveries, attempts, createdAt };
  }
}

export class Dispatcher {
  readonly #loops: Promise<void>[] = [];
  readonly #running = new Map<HeldRow, Running>();
  /** Set on a stop that timed out: late outcomes are dropped, their leases left to expire. */
  #abandoned = false;
  /** Timed-out handlers whose promise has not settled: they ignored their signal. */
  #overdue = 0;
  #sweeper: NodeJS.Timeout | undefined;
  readonly #sweepMs: number;
  /** Moving average of handler run time (ms); undefined until one finished. */
  #handlerMs: number | undefined;

  constructor(private readonly deps: DispatcherDeps) {
    // One timer for all handlers instead of one per message: a timeout fires within a quarter of itself
    // (at most a second) of its deadline, and costs nothing per message.
    const shortest = Math.min(...[...deps.queues.values()].map((q) => q.timeoutMs));
    this.#sweepMs = Math.max(5, Math.min(1000, Math.floor(shortest / 4)));
  }

  start(): void {
    for (let i = 0; i < this.deps.concurrency; i++) this.#loops.push(this.#loop());
    this.#sweeper = setInterval(() => this.#sweep(), this.#sweepMs);
    // The fetch loop keeps a running worker's process alive; this timer alone must not.
    this.#sweeper.unref();
  }

  /** Handlers running now. */
  get running(): number {
    return this.#running.size;
  }

  /** Moving average of handler run time (ms), undefined until a handler finished. */
  get handlerMs(): number | undefined {
    return this.#handlerMs;
  }

  /** Resolves when every loop has ended (the queue is closed and empty, and handlers returned). */
  done(): Promise<void> {
    return Promise.all(this.#loops).then(() => {
      clearInterval(this.#sweeper);
    });
  }

  /** Abort the handlers still running and drop their outcomes; returns them. */
  abandon(reason: Error): HeldRow[] {
    this.#abandoned = true;
    clearInterval(this.#sweeper);
    const abandoned = [...this.#running.keys()];
    // Their leases are left to expire: another worker retries them.
    for (const held of abandoned) lose(held, reason);
    return abandoned;
  }

  /** Time out overdue handlers: abort their signal and stop waiting for them, so their slot is freed. */
  #sweep(): void {
    const now = performance.now();
    for (const [held, running] of this.#running) {
      if (running.expired || now < running.deadline || running.expire === undefined) continue;
      running.expired = true;
      this.#overdue++;
      const error = new HandlerTimeoutError(running.timeoutMs);
      abortHeld(held, error);
      running.expire(error);
      this.deps.timedOut(held, running.timeoutMs, this.#overdue);
    }
  }

  /** Wait for an async handler, or for its timeout, whichever comes first. */
  #settle(result: PromiseLike<unknown>, running: Running): Promise<unknown> {
    return new Promise((resolve, reject) => {
      running.expire = reject;
      result.then(
        (value) => {
          if (running.expired) this.#overdue--;
          resolve(value);
        },
        (error: unknown) => {
          if (running.expired) this.#overdue--;
          reject(error);
        },
      );
    });
  }

  async #loop(): Promise<void> {
    // Once per loop, not per message: after this, whether to trace is a synchronous check.
    if (!tracingLoaded()) await loadTracing();
    for (;;) {
      const held = this.deps.queue.tryTake() ?? (await this.deps.queue.take());
      if (!held) return;
      if (held.state !== "queued") continue;
      const outcome = await this.#process(held);
      // The heartbeat may have declared the lease lost while the handler ran: then startCompleting refuses.
      if (outcome && !this.#abandoned && startCompleting(held)) this.deps.submit(outcome);
    }
  }

  async #process(held: HeldRow): Promise<Outcome | undefined> {
    const { row } = held;
    const dead = (reason: string, error: string | null): Outcome => ({
      kind: "dead",
      held,
      reason,
      error,
      attempted: 0,
      failed: 0,
    });
    const queue = this.deps.queues.get(row.queue);
    if (!queue) return dead("no_handler", `no handler for queue "${row.queue}"`);
    // Max deliveries, payload parse and schema: decided in decide-outcome.ts, shared with the test harness.
    const prepared = prepareDelivery(queue, row, this.deps);
    if ("dead" in prepared) return { ...prepared.dead, held };
    const { payload } = prepared;

    let inbox: InboxRecord | undefined;
    if (queue.inbox && this.deps.inbox) {
      // Checked as late as possible, just before the handler would start: a record committed by an earlier
      // delivery any time before now is found. A delivery running at the same time is not (the lease and
      // its heartbeat keep that from happening; the README says what is left).
      const checked = await this.#checkInbox(held, queue, payload);
      if (checked.outcome) return checked.outcome;
      inbox = checked.record;
    }

    // A worker frozen past its lease (SIGSTOP, a VM pause, a long GC) may no longer own a row it queued:
    // another worker can have run it, and its key's next rows, already. Never start one unconfirmed.
    if (!confirmedNow(held) && !(await this.deps.confirm(held))) return undefined;
    if (!startRunning(held, performance.now())) return undefined;
    const running: Running = {
      deadline: held.startedAt + queue.timeoutMs,
      timeoutMs: queue.timeoutMs,
      expire: undefined,
      expired: false,
    };
    this.#running.set(held, running);
    this.deps.dispatched(held);
    const context = new Context(held);
    try {
      if (!queue.transaction) return await this.#run(held, queue, payload, context, running, inbox);
      return await this.#runInTransaction(held, queue, payload, context, running);
    } finally {
      this.#running.delete(held);
      const ms = performance.now() - held.startedAt;
      this.#handlerMs = this.#handlerMs === undefined ? ms : this.#handlerMs * 0.8 + ms * 0.2;
    }
  }

  /**
   * A transactional queue's delivery: BEGIN on a connection of its own, the handler with it, then the ack
   * in the same transaction and COMMIT. Only a failure goes to the completer (its retry or dead-letter
   * write is the batched one, as for any queue); an ack has landed, or been found lost, by the COMMIT.
   */
  async #runInTransaction(
    held: HeldRow,
    queue: ResolvedQueue,
    payload: unknown,
    context: Context,
    running: Running,
  ): Promise<Outcome | undefined> {
    const transactions = this.deps.transactions;
    let tx: LeaseTransaction;
    try {
      if (!transactions) throw new OutboxError("this worker's store cannot run handlers in a transaction");
      tx = await transactions.begin();
    } catch (error) {
      // No connection (the pool or the database is failing): the handler has not run; retried, not counted.
      context.seal();
      return this.#failure(
        held,
        queue,
        new TransientError(`could not open the handler's transaction: ${(error as Error).message}`, {
          cause: error,
        }),
      );
    }
    context.transaction = handlerClient(tx.client, () => !context.sealed);
    const outcome = await this.#run(held, queue, payload, context, running, undefined);
    // The handler has settled: the sweeper must not time out the ack that follows (the busy wait has its
    // own bound), nor count it overdue.
    running.expire = undefined;
    if (outcome.kind !== "ack") {
      // The handler threw or timed out: its writes are rolled back. A timed-out handler may still have a
      // query running on the connection: it is destroyed, never handed back to the pool dirty.
      await tx.rollback(running.expired ? new OutboxError("handler timed out") : undefined);
      return outcome;
    }
    const end = await commitWithAck(tx, outcome, {
      whereabouts: (h) => transactions.whereabouts(h),
      // A busy key is waited for while the handler's time lasts (at least a second): a livelock with a
      // producer waiting on a lock the handler took ends there, rolled back and retried.
      busyUntil: Math.max(Date.now() + (running.deadline - performance.now()), Date.now() + 1000),
      onBusy: (h) => transactions.busy?.(h),
    });
    try {
      if (end.kind === "acked") {
        if (startCompleting(held)) transactions.landed(outcome);
        return undefined;
      }
      if (end.kind === "lost") {
        transactions.lost(outcome);
        return undefined;
      }
      if (end.kind === "dropped") return undefined;
      // The worker's role may not insert follow-ups: as for a batched ack, no retry can help.
      if (followUpsRefused(end.error)) {
        const error = (end.error as Error).message;
        return { kind: "dead", held, reason: FOLLOW_UPS_REFUSED, error, attempted: 1, failed: 0 };
      }
      return this.#failure(held, queue, end.error);
    } finally {
      // Only now: the delivery is settled or lost, so a renewal that raced the COMMIT finds it final.
      held.writing = false;
    }
  }

  /** Run the handler (with its span and timeout) and turn what it did into an outcome. */
  async #run(
    held: HeldRow,
    queue: ResolvedQueue,
    payload: unknown,
    context: Context,
    running: Running,
    inbox: InboxRecord | undefined,
  ): Promise<Outcome> {
    // Undefined unless an OpenTelemetry SDK is registered: then the handler runs as before.
    const span = startProcessSpan(context);
    try {
      const result = span
        ? runInSpan(span, () => queue.handler(payload, context))
        : queue.handler(payload, context);
      // Only a promise can time out (a synchronous handler has already returned); no wrapper otherwise.
      const value = isThenable(result) ? await this.#settle(result, running) : result;
      context.seal();
      // A returned follow-up that fails validation throws here: the delivery is retried, nothing published.
      // Inside the process span: returned follow-ups carry the handler's trace context, as published ones do.
      if (value !== undefined && value !== null) {
        if (span) runInSpan(span, () => context.returned(value));
        else context.returned(value);
      }
      const followUps = context.followUps?.prepared;
      const ack: Outcome =
        followUps && followUps.length > 0
          ? { kind: "ack", held, durationMs: performance.now() - held.startedAt, followUps }
          : { kind: "ack", held, durationMs: performance.now() - held.startedAt };
      // The completer commits the record before the ack (a lost ack then still leaves the record).
      if (inbox) ack.inbox = inbox;
      if (span) endProcessSpan(span, { kind: "ack" });
      return ack;
    } catch (error) {
      // A retried or dead-lettered delivery publishes nothing: its follow-ups are dropped with the context.
      context.seal();
      const failure = this.#failure(held, queue, error);
      if (span) endSpan(span, failure, error);
      return failure;
    }
  }

  /**
   * The queue's dedupe key for this delivery, and whether the inbox holds it: held, the outcome is a
   * `deduped` ack (the handler does not run). A key function that throws, or a check the database cannot
   * answer, fails the attempt (the latter as transient: an outage is retried, never counted).
   */
  async #checkInbox(
    held: HeldRow,
    queue: ResolvedQueue,
    payload: unknown,
  ): Promise<{ outcome: Outcome; record?: undefined } | { outcome?: undefined; record: InboxRecord }> {
    const inbox = queue.inbox as NonNullable<ResolvedQueue["inbox"]>;
    let key: string;
    try {
      key = inbox.key ? inboxKey(inbox.key(payload, new Context(held))) : held.row.id;
    } catch (error) {
      return { outcome: this.#failure(held, queue, error) };
    }
    const record: InboxRecord = { consumer: inbox.consumer, key, id: held.row.id, queue: held.row.queue };
    let seen: boolean;
    try {
      seen = await (this.deps.inbox as Pick<InboxStore, "seen">).seen(record);
    } catch (error) {
      return {
        outcome: this.#failure(
          held,
          queue,
          new TransientError(`inbox check failed: ${(error as Error)?.message ?? String(error)}`, {
            cause: error,
          }),
        ),
      };
    }
    if (seen) return { outcome: { kind: "ack", held, durationMs: 0, inbox: record, deduped: true } };
    return { record };
  }

  #failure(held: HeldRow, queue: ResolvedQueue, error: unknown): Outcome {
    // Classification, maxAttempts and the retry strategy: decide-outcome.ts, shared with the test harness.
    const { outcome, problem } = decideFailure(queue, held.row, error, this.deps);
    if (problem) this.deps.strategyProblem(held, problem);
    return { ...outcome, held };
  }
}

/** The span records what the dispatcher decided; the completer writes it (or finds the lease lost). */
function endSpan(span: ProcessSpan, outcome: Outcome, error: unknown): void {
  endProcessSpan(
    span,
    outcome.kind === "retry"
      ? { kind: "retry", delayMs: outcome.delayMs }
      : outcome.kind === "dead"
        ? { kind: "dead", reason: outcome.reason }
        : undefined,
    error,
  );
}

/** A key function's answer, if it is usable as a dedupe key; throws (failing the attempt) if not. */
function inboxKey(key: unknown): string {
  if (
    typeof key !== "string" ||
    key.length === 0 ||
    key.length > MAX_INBOX_KEY_LENGTH ||
    key.includes("\0")
  ) {
    throw new OutboxConfigError(
      "inbox.key",
      "a non-empty string without NUL",
      `inbox.key must return a non-empty string of at most ${MAX_INBOX_KEY_LENGTH} characters without NUL, got ${typeof key === "string" ? `a string of ${key.length}` : typeof key}`,
    );
  }
  return key;
}

function isThenable(value: unknown): value is PromiseLike<unknown> {
  return (
    value !== null &&
    (typeof value === "object" || typeof value === "function") &&
    typeof (value as { then?: unknown }).then === "function"
  );
}
