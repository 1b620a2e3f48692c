import type { Logger } from "pino";
import { Completer, type Outcome } from "../complete/completer.js";
import { Heartbeat } from "../complete/heartbeat.js";
import { OutboxConfigError, OutboxError } from "../contract/errors.js";
import type { InboxStore } from "../contract/inbox.js";
import { Dispatcher } from "../dispatch/dispatcher.js";
import { LocalQueue } from "../dispatch/local-queue.js";
import { Fetcher } from "../fetch/fetcher.js";
import { confirmedNow, type HeldRow, heldRows, isLive, lose } from "../lease/held.js";
import type { LeaseStore } from "../lease/store.js";
import { AloneRuns } from "./alone-runs.js";
import { confirmedForMs } from "./confirmed-for.js";
import { type StopResult, stopEngine } from "./engine-stop.js";
import type { LeasePhase, WorkerEmitter } from "./events.js";
import { fetchLease } from "./fetch-lease.js";
import { HandBack } from "./hand-back.js";
import { HeldSet, liveTokens, renewable } from "./held-set.js";
import type { LoopHealth } from "./loop-health.js";
import type { ResolvedOptions } from "./options.js";
import { OwnLeases } from "./own-leases.js";
import { Prefetch } from "./prefetch.js";
import { dispatchReports, reportLanded, reportLongWait } from "./reports.js";

export { type StopResult, within } from "./engine-stop.js";

export interface EngineDeps {
  options: ResolvedOptions;
  store: LeaseStore;
  log: Logger;
  emitter: WorkerEmitter;
  health: LoopHealth;
  /** The inbox, when a queue has one. */
  inbox?: InboxStore;
  /** A loop gave up after `maxConsecutiveFailures`: the worker stops. */
  onFatal(error: Error): void;
}

/** The delivery engine without connections: fetch → bounded local queue → dispatch → completion, with the heartbeat. */
export interface Engine {
  /** Dispatch loops and the heartbeat; call before `startFetching`. */
  startDispatching(): void;
  startFetching(): void;
  /** Look for rows now (a notification, a reconnect). */
  wake(): void;
  /** Whether LISTEN delivers wake-ups; without them empty polls stay at the minimum interval. */
  setWakeUps(on: boolean): void;
  /** No new leases; hand back unstarted rows; wait (bounded) for handlers and outcomes. */
  shutdown(timeoutMs: number, alongside?: Promise<unknown>): Promise<StopResult>;
  /** Deliveries held right now (queued, running, completing). */
  readonly held: number;
  /**
   * Clear now the leases of rows left under this worker's own tokens that it no longer holds (a database
   * crash undid their outcome writes), so they are delivered again at once → how many. Nothing once stopping.
   */
  reclaimStale(): Promise<number>;
}

/** The fetch loop's batch sizes, poll intervals and backoff, from the worker's options (both lease modes). */
export function fetchPacing(options: ResolvedOptions) {
  return {
    batchSize: options.batchSize,
    // A trickle is leased a loop's worth at a time; full fetches double it towards batchSize.
    minBatch: Math.min(options.batchSize, Math.max(options.concurrency, 10)),
    minPollMs: options.minPollIntervalMs,
    maxPollMs: options.maxPollIntervalMs,
    backoffBaseMs: options.loopBackoffBaseMs,
    backoffMaxMs: options.loopBackoffMaxMs,
    maxConsecutiveFailures: options.maxConsecutiveFailures,
  };
}

/** What the dispatch loops apply to every row, from the worker's options (both lease modes). */
export function dispatchRules(options: ResolvedOptions) {
  return {
    concurrency: options.concurrency,
    queues: options.queues,
    maxDeliveries: options.maxDeliveries,
    retry: options.retry,
    maxErrorLength: options.maxErrorLength,
  };
}

/** A completion waiting this long on a producer of its key is logged (warn), once. */
const LONG_WAIT_MS = 10_000;

/** The store's way to open a handler's transaction; refused when a queue wants one and the store has none. */
function handlerTransactions(options: ResolvedOptions, store: LeaseStore): LeaseStore["begin"] {
  const begin = store.begin?.bind(store);
  const transactional = [...options.queues.values()].filter((q) => q.transaction).map((q) => q.name);
  if (transactional.length > 0 && !begin) {
    throw new OutboxConfigError(
      `queues.${transactional[0]}.transaction`,
      "this lease store has no database to open a transaction on",
      `queues.${transactional[0]}.transaction: this lease store has no database to open a transaction on`,
    );
  }
  return begin;
}

/**
 * The pieces are made in the order a row passes them: fetch → local queue → dispatch → completion (with the
 * heartbeat renewing what is held) → stop. Some callbacks name a piece made further down (how much to
 * fetch depends on the completions pending; a completion hands rows back to the queue): none runs before
 * the engine starts.
 */
export function createEngine(deps: EngineDeps): Engine {
  const { options, store, log, emitter, health } = deps;
  const begin = handlerTransactions(options, store);
  // Twice what one fetch or the dispatch loops need, so the next fetch runs while acks are still in flight
  // instead of waiting for them to free slots (a drain otherwise alternates fetch and ack round trips).
  const capacity = 2 * Math.max(options.batchSize, options.concurrency);
  // Deliveries, not rows: after its own lease ran out this worker can hold the same row twice (the old
  // delivery still running, the new one leased again). Keyed by the object, a late outcome or cleanup of
  // the old one can never remove the new one's entry (which would stop its heartbeat). Their payload bytes
  // are bounded too (maxHeldBytes): rows of a megabyte must not be held by the hundred.
  const held = new HeldSet();
  let stopping = false;
  const confirmedFor = confirmedForMs(options);

  // Fetch: as many rows as the dispatch loops start before the next fetch lands, within the byte budget.
  const prefetch = new Prefetch({
    capacity,
    concurrency: options.concurrency,
    maxHeldBytes: options.maxHeldBytes,
  });
  // Rows held through a crash are leased alone, with nothing else held (see AloneRuns).
  const alone = new AloneRuns({
    probe: () => store.suspectsWaiting(liveTokens(held)),
    intervalMs: options.heartbeatMs,
    wake: () => fetcher.trigger(),
    log,
  });
  const leaseBatch = fetchLease({
    store,
    prefetch,
    held,
    health,
    maxHeldBytes: options.maxHeldBytes,
    confirmedForMs: confirmedFor,
  });
  const fetcher = new Fetcher<HeldRow>({
    ...fetchPacing(options),
    free: () =>
      alone.free(held.size, () =>
        prefetch.free({
          queued: queue.size,
          completing: completer.pending,
          held: held.size,
          heldBytes: held.bytes,
          handlerMs: dispatcher.handlerMs,
        }),
      ),
    lease: async (limit) => {
      if (!alone.next) return leaseBatch(limit);
      const started = performance.now();
      // Our own deliveries still running (the event loop was blocked past their lease) are never taken.
      const lease = await store.leaseAlone(liveTokens(held));
      health.recovered("fetch");
      const [row] = heldRows(lease.token, lease.rows, started + confirmedFor);
      alone.took(row);
      // None waits: lease a batch at once.
      return row ? { rows: [row] } : { rows: [], more: true };
    },
    deliver: (batch) => take(batch),
    onError: (error, n) => health.failed("fetch", error, n),
    onFatal: deps.onFatal,
  });
  // Tokens are this process's identity (acquired_by is shared by processes on one host): rows left under
  // one of them that it no longer holds are stale, and are taken back after a crash (reclaimStale).
  const own = new OwnLeases({
    store,
    held: () => held,
    keepMs: options.leaseTtlMs + options.queryTimeoutMs,
    log,
    emitter,
    wake: () => fetcher.trigger(),
  });

  // Local queue: rows leased to this worker (a fetch, or a hand-off by a completion) wait here for a loop.
  const queue = new LocalQueue<HeldRow>(capacity);
  queue.onTake = (sizeAfter) => {
    // Refill at half capacity: fetching one row per freed slot would cost a round trip per message.
    if (sizeAfter <= Math.floor(capacity / 2)) fetcher.slotsFreed();
  };
  const handBack = new HandBack({
    store,
    held,
    forget: (h, phase) => forget(h, phase),
    log,
    emitter,
    health,
  });
  function take(batch: HeldRow[]): void {
    if (batch.length === 0) return;
    own.wrote(batch);
    // A lease that outlived the stop's wait for it (a slow round trip), or more than fits: give the rows
    // straight back. The reservations keep the second from happening; this keeps the queue's bound anyway.
    const fits = queue.closed ? 0 : Math.min(batch.length, queue.free);
    if (fits < batch.length) handBack.late(batch.slice(fits));
    if (fits === 0) return;
    const kept = batch.slice(0, fits);
    for (const h of kept) held.add(h);
    queue.push(kept);
    emitter.emit("fetched", { count: kept.length });
  }

  // Dispatch: the loops take rows from the queue, run the handlers and submit the outcomes.
  const dispatcher = new Dispatcher({
    queue,
    ...dispatchRules(options),
    submit: (o) => completer.submit(o),
    confirm: (h) => confirm(h),
    ...(begin
      ? {
          transactions: {
            begin,
            whereabouts: async (h: HeldRow) => (await store.whereabouts([h]))[0] ?? "taken",
            landed: (o) => completer.landedElsewhere(o),
            lost: (o) => forget(o.held, "ack"),
          },
        }
      : {}),
    ...(deps.inbox ? { inbox: deps.inbox } : {}),
    ...dispatchReports(deps),
  });

  // Completion: outcomes written in batches; a keyed one may hand the key's next row straight to the queue.
  const completer = new Completer({
    store,
    ...(deps.inbox ? { inbox: deps.inbox } : {}),
    batchSize: options.completionBatchSize,
    windowMs: options.completionWindowMs,
    backoffBaseMs: options.loopBackoffBaseMs,
    backoffMaxMs: options.loopBackoffMaxMs,
    maxConsecutiveFailures: options.maxConsecutiveFailures,
    landed: (o: Outcome) => {
      health.recovered("complete");
      held.delete(o.held);
      reportLanded(deps, o);
    },
    lost: (o: Outcome) => forget(o.held, o.kind),
    handOff: {
      // No room to find: the rows handed off replace the heads completed, one for one (at most one new head
      // per keyed delivery), so they take slots those rows held, and the held count does not grow.
      // A stopping worker takes no new rows: the next message of the key is left for the others; nor does
      // one whose byte budget is spent (a fetch takes those rows once it has room).
      reserve: (upTo) => (stopping || held.bytes >= options.maxHeldBytes ? 0 : upTo),
      settle: (_reserved, lease, sentAt) => {
        if (lease !== undefined) take(heldRows(lease.token, lease.rows, sentAt + confirmedFor));
      },
    },
    flushed: () => fetcher.slotsFreed(),
    longWait: { afterMs: LONG_WAIT_MS, report: (o, waitedMs) => reportLongWait(deps, o, waitedMs) },
    onError: (error, n) => health.failed("complete", error, n),
    onFatal: deps.onFatal,
  });
  /** A write or a renewal found another token on the row: the newer owner wins, this delivery is dropped. */
  function forget(h: HeldRow, phase: LeasePhase): void {
    if (!lose(h, new OutboxError("lease lost: another worker took this message over"))) return;
    held.delete(h);
    queue.remove((x) => x === h);
    completer.forget(h);
    const { id, queue: q, deliveries_count: deliveries } = h.row;
    log.warn({ id, queue: q, deliveries, phase }, "lease lost; the newer owner wins");
    emitter.emit("lease_lost", { id, queue: q, deliveries, phase });
  }

  // Heartbeat: every lease held is renewed, but those of outcomes that cannot be written.
  const heartbeat = new Heartbeat({
    intervalMs: options.heartbeatMs,
    confirmedForMs: confirmedFor,
    store,
    collect: () => {
      const rows = renewable(held, completer.failing);
      own.wrote(rows);
      return rows;
    },
    lost: (h) => forget(h, "heartbeat"),
    onError: (error, n) => health.failed("heartbeat", error, n),
    onRecovered: () => health.recovered("heartbeat"),
  });

  /**
   * A queued row whose confirmation ran out: renew every held lease now (token-fenced) and start it only if
   * the renewal kept it. A row the renewal did not find is forgotten by the heartbeat; one it could not
   * confirm (the database did not answer) is dropped here, never started: its lease runs out, and the next
   * fetch of any worker takes it.
   */
  async function confirm(h: HeldRow): Promise<boolean> {
    await heartbeat.beatNow();
    if (confirmedNow(h)) return isLive(h);
    forget(h, "start");
    return false;
  }

  const parts = { fetcher, queue, handBack, dispatcher, held, completer, heartbeat, log, emitter };
  return {
    startDispatching() {
      dispatcher.start();
      heartbeat.start();
      alone.start();
    },
    startFetching: () => fetcher.start(),
    wake: () => fetcher.trigger(),
    setWakeUps: (on) => fetcher.setWakeUps(on),
    shutdown(timeoutMs, alongside) {
      stopping = true;
      alone.stop();
      return stopEngine(parts, timeoutMs, alongside);
    },
    get held() {
      return held.size;
    },
    reclaimStale: () => (stopping ? Promise.resolve(0) : own.reclaim()),
  };
}
