/**
 * N dispatch loops drain the local queue. Per row: refuse crash loops (max deliveries), validate the
 * payload, run the handler with an AbortSignal, and turn what happened into one outcome for the completer.
 */
import type { Outcome } from "../complete/completer.js";
import { decide, defaultRetry, type RetryStrategy } from "../retry/strategies.js";
import { abortHeld, type HeldRow, heldSignal } from "../worker/held.js";
import type { MessageContext, ResolvedQueue } from "../worker/options.js";
import { classifyError, errorMessage } from "./errors.js";
import type { LocalQueue } from "./local-queue.js";

export interface DispatcherDeps {
  queue: LocalQueue<HeldRow>;
  concurrency: number;
  queues: Map<string, ResolvedQueue>;
  maxDeliveries: number;
  retry: RetryStrategy | undefined;
  maxErrorLength: number;
  submit(outcome: Outcome): void;
  dispatched(held: HeldRow): void;
  /** A retry strategy returned something unusable; the default was used instead. */
  strategyProblem(held: HeldRow, problem: string): void;
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

  /** Made on first read: most handlers never look at it. */
  get createdAt(): Date {
    this.#createdAt ??= new Date(this.#held.row.created_epoch * 1000);
    return this.#createdAt;
  }

  get signal(): AbortSignal {
    return heldSignal(this.#held);
  }

  /** Getters live on the prototype; logging or JSON.stringify of a context still shows createdAt. */
  toJSON() {
    const { id, queue, key, headers, deliveries, attempts, createdAt } = this;
    return { id, queue, key, headers, deliveries, attempts, createdAt };
  }
}

export class Dispatcher {
  readonly #loops: Promise<void>[] = [];
  readonly #running = new Set<HeldRow>();
  /** Set on a stop that timed out: late outcomes are dropped, their leases left to expire. */
  #abandoned = false;

  constructor(private readonly deps: DispatcherDeps) {}

  get running(): ReadonlySet<HeldRow> {
    return this.#running;
  }

  start(): void {
    for (let i = 0; i < this.deps.concurrency; i++) this.#loops.push(this.#loop());
  }

  /** Resolves when every loop has ended (the queue is closed and empty, and handlers returned). */
  done(): Promise<void> {
    return Promise.all(this.#loops).then(() => undefined);
  }

  /** Abort the handlers still running and drop their outcomes; returns their ids. */
  abandon(reason: Error): string[] {
    this.#abandoned = true;
    const ids: string[] = [];
    for (const held of this.#running) {
      ids.push(held.row.id);
      abortHeld(held, reason);
    }
    return ids;
  }

  async #loop(): Promise<void> {
    for (;;) {
      const held = this.deps.queue.tryTake() ?? (await this.deps.queue.take());
      if (!held) return;
      if (held.state !== "queued") continue;
      const outcome = await this.#process(held);
      // The heartbeat may have declared the lease lost while the handler ran (state changes across await).
      if (outcome && !this.#abandoned && (held.state as HeldRow["state"]) !== "lost") {
        held.state = "completing";
        this.deps.submit(outcome);
      }
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
    // A row leased this often keeps killing its worker (or timing out): stop before it runs again.
    if (row.deliveries_count > this.deps.maxDeliveries) {
      return dead("max_deliveries", `leased ${row.deliveries_count} times (max ${this.deps.maxDeliveries})`);
    }
    let payload = row.payload;
    if (queue.schema) {
      const parsed = queue.schema.safeParse(row.payload);
      if (!parsed.success) {
        const problems = parsed.error.issues.map((i) => `${i.path.join(".") || "(payload)"}: ${i.message}`);
        return dead("invalid_payload", problems.join("; "));
      }
      payload = parsed.data;
    }

    held.state = "running";
    held.startedAt = performance.now();
    this.#running.add(held);
    this.deps.dispatched(held);
    const context = new Context(held);
    try {
      await queue.handler(payload, context);
      return { kind: "ack", held, durationMs: performance.now() - held.startedAt };
    } catch (error) {
      return this.#failure(held, queue, error);
    } finally {
      this.#running.delete(held);
    }
  }

  #failure(held: HeldRow, queue: ResolvedQueue, error: unknown): Outcome {
    const message = errorMessage(error, this.deps.maxErrorLength);
    const kind = classifyError(error);
    if (kind === "permanent") {
      return { kind: "dead", held, reason: "rejected", error: message, attempted: 1, failed: 1 };
    }
    const failed = kind === "transient" ? 0 : 1;
    const failures = held.row.failures_count + failed;
    if (failed && failures >= queue.maxAttempts) {
      return { kind: "dead", held, reason: "retries_exhausted", error: message, attempted: 1, failed: 1 };
    }
    const { decision, problem } = decide(queue.retry ?? this.deps.retry ?? defaultRetry, {
      attempts: held.row.attempts_count + 1,
      failures,
      firstAttemptAt: held.row.first_attempt_at,
      lastAttemptAt: held.row.last_attempt_at,
      error,
    });
    if (problem) this.deps.strategyProblem(held, problem);
    if (decision === "stop") {
      return { kind: "dead", held, reason: "retries_exhausted", error: message, attempted: 1, failed };
    }
    return {
      kind: "retry",
      held,
      delayMs: decision,
      error: message,
      failed,
      transient: kind === "transient",
    };
  }
}
