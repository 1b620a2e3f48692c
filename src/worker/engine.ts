import type { Logger } from "pino";
import { Completer, type Outcome } from "../complete/completer.js";
import { Heartbeat } from "../complete/heartbeat.js";
import { OutboxConfigError, OutboxError } from "../contract/errors.js";
import type { InboxStore } from "../contract/inbox.js";
import { Dispatcher } from "../dispatch/dispatcher.js";
import { LocalQueue } from "../dispatch/local-queue.js";
import { Fetcher } from "../fetch/fetcher.js";
import { type HeldRow, heldRows, isLive, lose, settle } from "../lease/held.js";
import type { LeaseStore } from "../lease/store.js";
import type { LeasePhase, WorkerEmitter } from "./events.js";
import { HeldSet, payloadBytes } from "./held-set.js";
import type { LoopHealth } from "./loop-health.js";
import type { ResolvedOptions } from "./options.js";
import { OwnLeases } from "./own-leases.js";

/** How {@link Worker.stop} went: whether the worker drained, or what it left behind. */
export interface StopResult {
  /** True when every handler finished within the timeout and every outcome was written. */
  drained: boolean;
  /** Rows fetched but never started, handed back for another worker. */
  released: number;
  /** Handlers still running at the timeout: aborted, their leases left to expire. */
  abandoned: string[];
}

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

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

/** A completion waiting this long on a producer of its key is logged (warn), once. */
const LONG_WAIT_MS = 10_000;

/**
 * A fetch's round trip counts for the prefetch estimate as if it had carried at most this many payload
 * bytes. Beyond that its time grows with its bytes (Postgres turns about 30 MB/s of jsonb into text): rows
 * kept locally cannot hide that, and counting it would make the next fetch bigger, and slower, still.
 */
const FETCH_TIME_BYTES = 2 ** 20;

/** True if `promise` settles within `ms`. The timer is cleared either way, so it never holds the process open. */
export async function within(promise: Promise<unknown>, ms: number): Promise<boolean> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<false>((resolve) => {
    timer = setTimeout(() => resolve(false), ms);
  });
  try {
    return await Promise.race([promise.then(() => true), timeout]);
  } finally {
    clearTimeout(timer);
  }
}

export function createEngine(deps: EngineDeps): Engine {
  const { options, store, log, emitter, health } = deps;
  const begin = store.begin?.bind(store);
  const transactional = [...options.queues.values()].filter((q) => q.transaction).map((q) => q.name);
  if (transactional.length > 0 && !begin) {
    throw new OutboxConfigError(
      `queues.${transactional[0]}.transaction`,
      "this lease store has no database to open a transaction on",
      `queues.${transactional[0]}.transaction: this lease store has no database to open a transaction on`,
    );
  }
  // Twice what one fetch or the dispatch loops need, so the next fetch runs while acks are still in flight
  // instead of waiting for them to free slots (a drain otherwise alternates fetch and ack round trips).
  const capacity = 2 * Math.max(options.batchSize, options.concurrency);
  // Deliveries, not rows: after its own lease ran out this worker can hold the same row twice (the old
  // delivery still running, the new one leased again). Keyed by the object, a late outcome or cleanup of
  // the old one can never remove the new one's entry (which would stop its heartbeat). Their payload bytes
  // are bounded too (maxHeldBytes): rows of a megabyte must not be held by the hundred.
  const held = new HeldSet();
  const queue = new LocalQueue<HeldRow>(capacity);
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
      const { id, queue: q } = o.held.row;
      if (o.kind === "ack" && o.deduped && o.inbox) {
        const { consumer, key } = o.inbox;
        log.debug(
          { id, queue: q, consumer, key },
          "already handled (inbox): acked without running the handler",
        );
        emitter.emit("deduped", { id, queue: q, consumer, key });
      } else if (o.kind === "ack") {
        if (emitter.hasListeners("acked")) emitter.emit("acked", { id, queue: q, durationMs: o.durationMs });
      } else if (o.kind === "retry") {
        log.debug({ id, queue: q, delayMs: o.delayMs, error: o.error }, "retry scheduled");
        health.retried(q, id, o.error);
        emitter.emit("retried", {
          id,
          queue: q,
          delayMs: o.delayMs,
          error: o.error,
          transient: o.transient,
          timedOut: o.timedOut,
        });
      } else {
        log.warn({ id, queue: q, reason: o.reason, error: o.error }, "message moved to dead letters");
        emitter.emit("dead_lettered", { id, queue: q, reason: o.reason, error: o.error });
      }
    },
    lost: (o: Outcome) => forget(o.held, o.kind),
    handOff: {
      // No room to find: the rows handed off replace the heads completed, one for one (at most one new head
      // per keyed delivery), so they take slots those rows held, and the held count does not grow.
      // A stopping worker takes no new rows: the next message of the key is left for the others; nor does
      // one whose byte budget is spent (a fetch takes those rows once it has room).
      reserve: (upTo) => (stopping || held.bytes >= options.maxHeldBytes ? 0 : upTo),
      settle: (_reserved, lease) => {
        if (lease !== undefined) take(heldRows(lease.token, lease.rows));
      },
    },
    flushed: () => fetcher.slotsFreed(),
    longWait: {
      afterMs: LONG_WAIT_MS,
      report: (o, waitedMs) => {
        const { id, queue: q, key } = o.held.row;
        log.warn(
          { id, queue: q, key, waitedMs },
          "completion waiting on a producer's open transaction on its key: the key goes on once it commits",
        );
      },
    },
    onError: (error, n) => health.failed("complete", error, n),
    onFatal: deps.onFatal,
  });

  // Round trip of the last leases (moving average, ms, each counted up to FETCH_TIME_BYTES): how long a row
  // takes to arrive once asked for.
  let fetchMs = 1;
  // Payload bytes of a row, as recent fetches brought them (unknown before the first): a fetch asks for no
  // more rows than fit in the byte budget left, whatever the statement's cut counted (a compressed
  // payload's stored size is far below its text).
  let rowBytes: number | undefined;
  // Room promised to the fetch in flight: not free for the next.
  let fetchReserved = 0;
  let stopping = false;
  // Hand-backs of rows that arrived after the stop began: the stop waits for them before it returns.
  const lateReleases = new Set<Promise<number>>();
  let lateReleased = 0;
  /**
   * Free slots for the next fetch: room in the local queue, but no more rows than the dispatch loops can
   * start before the next fetch would land. With slow handlers a worker must not hoard rows that another,
   * idle worker could run now: rows wait locally only as long as it takes to fetch more.
   */
  function free(): number {
    const queued = queue.size;
    const room = capacity - queued - completer.pending - fetchReserved;
    const handlerMs = dispatcher.handlerMs;
    // Until a handler finished, one loop's worth ahead: a first fetch must not hoard rows for handlers
    // that may take seconds.
    const soon =
      handlerMs === undefined
        ? options.concurrency
        : Math.ceil((options.concurrency * (2 * fetchMs + 1)) / Math.max(handlerMs, 0.001));
    // Counted over every held row not yet completing: queued, handed to a loop but not started, running.
    const active = held.size - completer.pending;
    return Math.min(room, Math.max(0, options.concurrency + soon - active), rowsInBudget());
  }

  /** Rows of the recent size that fit in the byte budget left; at least one while nothing is held. */
  function rowsInBudget(): number {
    const left = options.maxHeldBytes - held.bytes;
    // Size unknown yet: the statement's cut alone.
    if (rowBytes === undefined) return left > 0 ? capacity : 0;
    const fit = Math.floor(left / rowBytes);
    return held.size === 0 ? Math.max(1, fit) : fit;
  }

  /** A fetch brought `bytes` in `rows` rows: learn the row size (up at once, down slowly) and the round trip. */
  function fetched(rows: number, bytes: number, ms: number): void {
    if (rows > 0) {
      const mean = bytes / rows;
      rowBytes = rowBytes === undefined ? mean : Math.max(mean, rowBytes * 0.8 + mean * 0.2);
    }
    fetchMs = fetchMs * 0.8 + ms * Math.min(1, FETCH_TIME_BYTES / Math.max(1, bytes)) * 0.2;
  }

  /**
   * The tokens of the deliveries this worker still holds. A handler that blocked the event loop past its
   * lease is still ours: the fetch must not lease its row again and start it twice (the heartbeat renews it
   * once the loop is free). A few tokens at most: one per fetch still being worked through.
   */
  function heldTokens(): string[] {
    const tokens = new Set<string>();
    for (const h of held) if (isLive(h)) tokens.add(h.token);
    return [...tokens];
  }

  const fetcher = new Fetcher<HeldRow>({
    batchSize: options.batchSize,
    // A trickle is leased a loop's worth at a time; full fetches double it towards batchSize.
    minBatch: Math.min(options.batchSize, Math.max(options.concurrency, 10)),
    minPollMs: options.minPollIntervalMs,
    maxPollMs: options.maxPollIntervalMs,
    backoffBaseMs: options.loopBackoffBaseMs,
    backoffMaxMs: options.loopBackoffMaxMs,
    maxConsecutiveFailures: options.maxConsecutiveFailures,
    free,
    lease: async (limit) => {
      const started = performance.now();
      fetchReserved = limit;
      try {
        // The statement stops at the bytes left. It always takes one row, so a row larger than the budget
        // is still delivered: what is held can pass the budget by that one row.
        const lease = await store.lease(limit, Math.max(1, options.maxHeldBytes - held.bytes), heldTokens());
        let bytes = 0;
        for (const row of lease.rows) bytes += payloadBytes(row);
        fetched(lease.rows.length, bytes, performance.now() - started);
        health.recovered("fetch");
        return { rows: heldRows(lease.token, lease.rows), more: lease.more };
      } finally {
        fetchReserved = 0;
      }
    },
    deliver: (batch) => take(batch),
    onError: (error, n) => health.failed("fetch", error, n),
    onFatal: deps.onFatal,
  });
  queue.onTake = (sizeAfter) => {
    // Refill at half capacity: fetching one row per freed slot would cost a round trip per message.
    if (sizeAfter <= Math.floor(capacity / 2)) fetcher.slotsFreed();
  };

  const heartbeat = new Heartbeat({
    intervalMs: options.heartbeatMs,
    store,
    collect: () => {
      // While outcome writes fail, their rows are not renewed: a lease kept alive for an outcome that
      // cannot be written would lock the row to this worker for as long as the writes keep failing.
      const stalled = completer.failing;
      const rows: HeldRow[] = [];
      for (const h of held) {
        if (h.writing || !isLive(h)) continue;
        if (stalled && h.state === "completing") continue;
        rows.push(h);
      }
      own.wrote(rows);
      return rows;
    },
    lost: (h) => forget(h, "heartbeat"),
    onError: (error, n) => health.failed("heartbeat", error, n),
    onRecovered: () => health.recovered("heartbeat"),
  });

  const dispatcher = new Dispatcher({
    queue,
    concurrency: options.concurrency,
    queues: options.queues,
    maxDeliveries: options.maxDeliveries,
    retry: options.retry,
    maxErrorLength: options.maxErrorLength,
    submit: (o) => completer.submit(o),
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
    dispatched: (h) => {
      // Guarded: an event object per message is measurable at tens of thousands a second.
      if (emitter.hasListeners("dispatched")) {
        emitter.emit("dispatched", { id: h.row.id, queue: h.row.queue, deliveries: h.row.deliveries_count });
      }
    },
    strategyProblem: (h, problem) =>
      log.warn({ id: h.row.id, queue: h.row.queue, problem }, "retry strategy returned an unusable delay"),
    timedOut: (h, timeoutMs, stillRunning) => {
      const { id, queue: q } = h.row;
      log.warn(
        { id, queue: q, timeoutMs, stillRunning },
        "handler timed out: its signal is aborted, the attempt counts as a failure and the message is retried",
      );
      emitter.emit("handler_timeout", { id, queue: q, timeoutMs, stillRunning });
    },
  });

  /** Rows leased to this worker (a fetch, or a hand-off by a completion) join the local queue. */
  function take(batch: HeldRow[]): void {
    if (batch.length === 0) return;
    own.wrote(batch);
    // A lease that outlived the stop's wait for it (a slow round trip), or more than fits: give the rows
    // straight back. The reservations keep the second from happening; this keeps the queue's bound anyway.
    const fits = queue.closed ? 0 : Math.min(batch.length, queue.free);
    if (fits < batch.length) {
      const back = release(batch.slice(fits)).then((n) => {
        lateReleased += n;
        return n;
      });
      lateReleases.add(back);
      void back.finally(() => lateReleases.delete(back));
    }
    if (fits === 0) return;
    const kept = batch.slice(0, fits);
    for (const h of kept) held.add(h);
    queue.push(kept);
    emitter.emit("fetched", { count: kept.length });
  }

  async function release(rows: HeldRow[]): Promise<number> {
    if (rows.length === 0) return 0;
    for (let attempt = 1; ; attempt++) {
      try {
        const back = await store.release(rows);
        for (const h of rows) {
          // Not handed back: another worker took the row over while it waited here.
          if (!back.has(h)) {
            forget(h, "release");
            continue;
          }
          settle(h, "released");
          held.delete(h);
        }
        emitter.emit("released", { count: back.count });
        return back.count;
      } catch (error) {
        health.failed("release", error as Error, attempt);
        if (attempt >= 3) {
          // Unreleased rows are not lost: their leases expire and another worker takes them. This worker
          // holds them no more (nor renews them).
          for (const h of rows) {
            lose(h, new OutboxError("could not hand back; its lease is left to expire"));
            held.delete(h);
          }
          log.warn(
            { rows: rows.length },
            "could not hand back unstarted rows; their leases are left to expire",
          );
          return 0;
        }
        await sleep(200 * attempt);
      }
    }
  }

  async function shutdown(timeoutMs: number, alongside?: Promise<unknown>): Promise<StopResult> {
    stopping = true;
    const deadline = Date.now() + timeoutMs;
    const left = () => Math.max(0, deadline - Date.now());
    // Bookkeeping writes (handing back unstarted rows, the last outcomes) get at least this long.
    const writeGrace = () => Math.max(1000, left());
    // Every wait here is bounded: a statement stuck on a dead connection ends by its own query timeout, and
    // stop() must not wait for that. What it was doing is then left to the leases' expiry.
    await within(Promise.all([fetcher.stop(), alongside]), writeGrace());
    const unstarted = queue.drain();
    queue.close();
    let released = 0;
    await within(
      release(unstarted).then((n) => {
        released = n;
      }),
      writeGrace(),
    );

    let abandoned: string[] = [];
    const finished = await within(dispatcher.done(), left());
    if (!finished) {
      const rows = dispatcher.abandon(new OutboxError("worker stop timeout"));
      for (const h of rows) held.delete(h);
      abandoned = rows.map((h) => h.row.id);
      log.warn({ abandoned }, "stop timeout: handlers aborted, their leases are left to expire");
      emitter.emit("drain_timeout", { abandoned });
    }
    const flushed = await within(completer.idle(), writeGrace());
    completer.stop();
    await within(
      Promise.all(lateReleases).then(() => {
        released += lateReleased;
      }),
      writeGrace(),
    );
    await within(heartbeat.stop(), left());
    const drained = finished && flushed && completer.pending === 0;
    return { drained, released, abandoned };
  }

  return {
    startDispatching() {
      dispatcher.start();
      heartbeat.start();
    },
    startFetching: () => fetcher.start(),
    wake: () => fetcher.trigger(),
    setWakeUps: (on) => fetcher.setWakeUps(on),
    shutdown,
    get held() {
      return held.size;
    },
    reclaimStale: () => (stopping ? Promise.resolve(0) : own.reclaim()),
  };
}
