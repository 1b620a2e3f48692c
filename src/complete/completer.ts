/**
 * Batches handler outcomes and writes them with ONE statement per kind (ack, retry, dead), each guarded by
 * (id, lease token). A write that fails is retried with backoff as the same batch: the token makes a
 * repeat harmless. An outcome is reported only after its write has landed; a row missing from RETURNING
 * was taken over by another worker (`lease_lost`) and is not touched again; one answered busy (a producer
 * of its key has not committed) is written again later.
 */

import { FOLLOW_UPS_REFUSED } from "../contract/follow-up.js";
import type { InboxRecord, InboxStore } from "../contract/inbox.js";
import { type HeldRow, settle } from "../lease/held.js";
import type { Outcome, OutcomeOf } from "../lease/outcome.js";
import { followUpsRefused, handedOffBy, type Landed, type Lease, type LeaseStore } from "../lease/store.js";
import { backoffDelay } from "../retry/strategies.js";

export type { Outcome };

const SETTLED = { ack: "acked", retry: "retried", dead: "dead" } as const;

export interface CompleterDeps {
  store: Pick<LeaseStore, "ack" | "retry" | "deadLetter" | "whereabouts">;
  /** Writes the inbox records of acks whose queue has an inbox; undefined when no queue has one. */
  inbox?: Pick<InboxStore, "record">;
  /** The outcome's write landed (the delivery is already settled). */
  landed(outcome: Outcome): void;
  lost(outcome: Outcome): void;
  /** Called after each successful flush, so the fetcher can use the slots it freed. */
  flushed(): void;
  /**
   * Hand-off of the next message of each key whose head an ack or dead-letter move removes: `reserve`
   * says how many rows (up to `upTo`, one per keyed delivery written) the caller takes now, and `settle`
   * gets the rows the write leased to it, if any.
   */
  handOff?: {
    reserve(upTo: number): number;
    /** `sentAt`: performance.now() before the write was sent (the hand-off's lease is at least that new). */
    settle(reserved: number, lease: Lease | undefined, sentAt: number): void;
  };
  onError(error: Error, consecutive: number): void;
  onFatal(error: Error): void;
  /**
   * An outcome answered busy for `afterMs` already (a producer's transaction on its key stays open): told
   * once per outcome, so a long wait is seen, not only failures.
   */
  longWait?: { afterMs: number; report(outcome: Outcome, waitedMs: number): void };
  batchSize: number;
  windowMs: number;
  backoffBaseMs: number;
  backoffMaxMs: number;
  maxConsecutiveFailures: number;
}

/**
 * Batches written at once: while one batch's statement runs, the next is written beside it instead of
 * waiting. A keyed ack also promotes and hands off the next row of each key, so the completion is the
 * keyed drain's critical path: one flush at a time would leave Postgres one core for it.
 */
const MAX_FLUSHES = 2;

/** Pauses before an outcome answered busy is written again: doubling from the first to the last. */
const BUSY_BASE_MS = 50;
const BUSY_MAX_MS = 1000;

export class Completer {
  #buffer: Outcome[] = [];
  #flushes = 0;
  #inFlight = 0;
  #timer: NodeJS.Timeout | undefined;
  /** Consecutive failed attempts of each batch being retried. */
  #failing = new Map<Outcome[], number>();
  #stopped = false;
  #idleWaiters: (() => void)[] = [];
  /** Outcomes answered busy, waiting to be written again (see #writeLater). */
  #waiting = new Set<Outcome>();
  /** Per outcome answered busy: how often, since when, and whether its long wait was reported. */
  #busy = new WeakMap<Outcome, { tries: number; since: number; reported: boolean }>();
  #busyTimers = new Set<NodeJS.Timeout>();

  constructor(private readonly deps: CompleterDeps) {}

  /** True while writes fail: outcomes wait unwritten, so their leases should not be kept alive. */
  get failing(): boolean {
    return this.#failing.size > 0;
  }

  /** Outcomes accepted but not yet landed (they still hold their local slots). */
  get pending(): number {
    return this.#buffer.length + this.#inFlight + this.#waiting.size;
  }

  submit(outcome: Outcome): void {
    this.#buffer.push(outcome);
    this.#kick();
  }

  #kick(): void {
    if (this.#flushes >= MAX_FLUSHES) return;
    if (this.#buffer.length >= this.deps.batchSize) {
      this.#startFlush();
    } else if (!this.#timer) {
      this.#timer = setTimeout(() => this.#startFlush(), this.deps.windowMs);
    }
  }

  /**
   * An outcome whose write landed elsewhere (an ack committed in its handler's own transaction): reported
   * exactly as one this completer wrote (state, events, metrics, freed slots).
   */
  landedElsewhere(outcome: Outcome): void {
    settle(outcome.held, SETTLED[outcome.kind]);
    this.deps.landed(outcome);
    if (!this.#stopped) this.deps.flushed();
  }

  /** Drop buffered outcomes of rows that were lost meanwhile (their write would touch nothing). */
  forget(held: HeldRow): void {
    this.#buffer = this.#buffer.filter((o) => o.held !== held);
    for (const o of this.#waiting) if (o.held === held) this.#waiting.delete(o);
  }

  /** Resolves when everything submitted so far has landed (or the completer was stopped). */
  idle(): Promise<void> {
    if (this.pending === 0 || this.#stopped) return Promise.resolve();
    if (this.#flushes === 0 && !this.#timer) this.#startFlush();
    return new Promise((resolve) => this.#idleWaiters.push(resolve));
  }

  /** Stop retrying failed writes; leases of unwritten outcomes expire and the rows are redelivered. */
  stop(): void {
    this.#stopped = true;
    clearTimeout(this.#timer);
    this.#timer = undefined;
    for (const t of this.#busyTimers) clearTimeout(t);
    this.#busyTimers.clear();
    for (const w of this.#idleWaiters.splice(0)) w();
  }

  #startFlush(): void {
    clearTimeout(this.#timer);
    this.#timer = undefined;
    if (this.#stopped || this.#flushes >= MAX_FLUSHES || this.#buffer.length === 0) return;
    const batch = this.#buffer.splice(0, this.deps.batchSize);
    this.#flushes++;
    this.#inFlight += batch.length;
    for (const o of batch) o.held.writing = true;
    void this.#writeUntilLanded(batch).finally(() => {
      for (const o of batch) o.held.writing = false;
      this.#flushes--;
      this.#inFlight -= batch.length;
      if (this.#stopped) return;
      this.deps.flushed();
      // Outcomes that arrived meanwhile have waited a window already.
      if (this.#buffer.length > 0) this.#startFlush();
      else if (this.pending === 0) for (const w of this.#idleWaiters.splice(0)) w();
    });
  }

  async #writeUntilLanded(batch: Outcome[]): Promise<void> {
    const kinds = new Map<Outcome["kind"], Outcome[]>();
    for (const o of batch) {
      const items = kinds.get(o.kind);
      if (items) items.push(o);
      else kinds.set(o.kind, [o]);
    }
    let failures = 0;
    try {
      for (;;) {
        // Each kind is one statement on rows the others don't touch, so they run side by side. A kind that
        // landed is not written again when another fails: a repeat would find its rows gone and call them lost.
        const retrying = failures > 0;
        const results = await Promise.allSettled(
          [...kinds].map(async ([kind, items]) => {
            const written = await this.#run(kind, items);
            // After a failed attempt, a delivery this attempt missed may be one the failed attempt wrote
            // (committed, answer lost): the row's fate tells it from one another worker took over.
            const earlier = retrying ? await this.#landedEarlier(kind, items, written) : undefined;
            kinds.delete(kind);
            const busy: Outcome[] = [];
            for (const o of items) {
              if (written.has(o.held) || earlier?.has(o)) {
                settle(o.held, SETTLED[o.kind]);
                this.deps.landed(o);
              } else if (written.busy?.(o.held)) busy.push(o);
              else this.deps.lost(o);
            }
            if (busy.length > 0) this.#writeLater(busy);
          }),
        );
        const failure = results.find((r): r is PromiseRejectedResult => r.status === "rejected");
        if (!failure) return;
        if (this.#refuseFollowUps(kinds, failure.reason)) continue;
        failures++;
        this.#failing.set(batch, failures);
        const error = failure.reason instanceof Error ? failure.reason : new Error(String(failure.reason));
        this.deps.onError(error, failures);
        if (failures >= this.deps.maxConsecutiveFailures) {
          this.deps.onFatal(error);
          this.stop();
          return;
        }
        await sleep(
          backoffDelay(failures, { baseMs: this.deps.backoffBaseMs, maxMs: this.deps.backoffMaxMs }),
        );
        if (this.#stopped) return;
      }
    } finally {
      this.#failing.delete(batch);
    }
  }

  /**
   * The worker's role may not insert follow-ups (no `--worker-can-follow-up`): no retry can help, and the
   * leases would run out while it tried (lease lost, redelivery, until max_deliveries). The acks that carry
   * follow-ups become dead letters naming the grant, at once; the batch's other acks are written again as
   * they were. False when `error` is not that refusal.
   */
  #refuseFollowUps(kinds: Map<Outcome["kind"], Outcome[]>, error: unknown): boolean {
    const acks = kinds.get("ack");
    if (!acks || !followUpsRefused(error)) return false;
    const refused = acks.filter((o) => o.kind === "ack" && (o.followUps?.length ?? 0) > 0);
    if (refused.length === 0) return false;
    const rest = acks.filter((o) => !refused.includes(o));
    if (rest.length > 0) kinds.set("ack", rest);
    else kinds.delete("ack");
    const message = (error as Error).message;
    const dead: Outcome[] = refused.map((o) => ({
      kind: "dead",
      held: o.held,
      reason: FOLLOW_UPS_REFUSED,
      error: message,
      attempted: 1,
      failed: 0,
    }));
    kinds.set("dead", [...(kinds.get("dead") ?? []), ...dead]);
    return true;
  }

  /**
   * Outcomes answered busy: a producer of their key has not committed, and may take as long as its
   * transaction does. Written again after a growing pause; meanwhile they count as pending, and their rows
   * stay held and renewed (not a failure: the batch's other outcomes landed, and nothing is wrong).
   */
  #writeLater(outcomes: Outcome[]): void {
    let tries = 0;
    const now = Date.now();
    const longWait = this.deps.longWait;
    for (const o of outcomes) {
      const busy = this.#busy.get(o) ?? { tries: 0, since: now, reported: false };
      this.#busy.set(o, busy);
      busy.tries++;
      tries = Math.max(tries, busy.tries);
      this.#waiting.add(o);
      if (longWait && !busy.reported && now - busy.since >= longWait.afterMs) {
        busy.reported = true;
        longWait.report(o, now - busy.since);
      }
    }
    const timer = setTimeout(
      () => {
        this.#busyTimers.delete(timer);
        if (this.#stopped) return;
        // One whose lease was lost meanwhile (forget) is not written.
        const again = outcomes.filter((o) => this.#waiting.delete(o));
        if (again.length === 0) return;
        this.#buffer.push(...again);
        this.#kick();
      },
      backoffDelay(tries, { baseMs: BUSY_BASE_MS, maxMs: BUSY_MAX_MS }),
    );
    this.#busyTimers.add(timer);
  }

  /**
   * The outcomes among `items` that `written` missed but whose row shows this kind's write: an ack's row is
   * gone, a dead letter's is in dead_letters, a retry's is unleased. A row under another token was taken over.
   */
  async #landedEarlier(kind: Outcome["kind"], items: Outcome[], written: Landed): Promise<Set<Outcome>> {
    const missed = items.filter((o) => !written.has(o.held));
    if (missed.length === 0) return new Set();
    const fates = await this.deps.store.whereabouts(missed.map((o) => o.held));
    const shows = { ack: "gone", retry: "unleased", dead: "dead" } as const;
    return new Set(missed.filter((_, i) => fates[i] === shows[kind]));
  }

  /**
   * The inbox records of the batch's acks whose handler ran, in ONE statement committed on its own, BEFORE
   * the ack statement: in the ack's transaction, a lost ack would lose its record too, and the redelivery
   * would run the handler again. A failure fails the batch (retried; ON CONFLICT makes the repeat harmless).
   * Left open: a crash after the handler succeeded and before this commits runs the handler again.
   */
  async #recordInbox(acks: readonly OutcomeOf<"ack">[]): Promise<void> {
    let records: InboxRecord[] | undefined;
    for (const o of acks) {
      if (o.inbox === undefined || o.deduped) continue;
      records ??= [];
      records.push(o.inbox);
    }
    if (records) await (this.deps.inbox as Pick<InboxStore, "record">).record(records);
  }

  async #run(kind: Outcome["kind"], items: Outcome[]): Promise<Landed> {
    const { store, handOff } = this.deps;
    if (kind === "retry") return store.retry(items as OutcomeOf<"retry">[]);
    if (kind === "ack" && this.deps.inbox) await this.#recordInbox(items as OutcomeOf<"ack">[]);
    // At most one new head per keyed delivery completed: keyless ones hand nothing on.
    const keyed = items.reduce((n, o) => (o.held.row.key === null ? n : n + 1), 0);
    const room = keyed === 0 ? 0 : (handOff?.reserve(keyed) ?? 0);
    const sentAt = performance.now();
    let lease: Lease | undefined;
    try {
      const landed =
        kind === "ack"
          ? await store.ack(items as OutcomeOf<"ack">[], room)
          : await store.deadLetter(items as OutcomeOf<"dead">[], room);
      lease = landed.handedOff;
      return landed;
    } catch (error) {
      lease = handedOffBy(error);
      throw error;
    } finally {
      handOff?.settle(room, lease, sentAt);
    }
  }
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}
