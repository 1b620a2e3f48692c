import { randomUUID } from "node:crypto";
import pg from "pg";
import pino, { type Logger } from "pino";
import { Completer, type Outcome } from "../complete/completer.js";
import { Heartbeat } from "../complete/heartbeat.js";
import { Dispatcher } from "../dispatch/dispatcher.js";
import { LocalQueue } from "../dispatch/local-queue.js";
import { Fetcher } from "../fetch/fetcher.js";
import { createNotifier, type Notifier } from "../notify/notifier.js";
import { type AckRow, completeStatements, type KeyRow } from "../sql/complete.js";
import { isPreparedStatementLost, plainArray, run, type Statement } from "../sql/executor.js";
import { fetchStatement, type LeasedRow } from "../sql/fetch.js";
import { outboxNames } from "../sql/names.js";
import { redactConnectionString, registerUrlSecrets } from "../util/redact.js";
import {
  type LeasePhase,
  type LoopName,
  WorkerEmitter,
  type WorkerEventName,
  type WorkerEvents,
} from "./events.js";
import { abortHeld, type HeldRow } from "./held.js";
import { type ResolvedOptions, resolveWorkerOptions, type WorkerOptions } from "./options.js";

/** How {@link Worker.stop} went: whether the worker drained, or what it left behind. */
export interface StopResult {
  /** True when every handler finished within the timeout and every outcome was written. */
  drained: boolean;
  /** Rows fetched but never started, handed back for another worker. */
  released: number;
  /** Handlers still running at the timeout: aborted, their leases left to expire. */
  abandoned: string[];
}

/** A running outbox consumer, made by {@link createWorker}. */
export interface Worker {
  /** Its `workerId`, written to `acquired_by` on the rows it leases. */
  readonly id: string;
  /** Connect, LISTEN and start fetching. Call once. */
  start(): Promise<void>;
  /**
   * Stop taking new leases, hand back unstarted rows, and wait up to `timeoutMs` (default `stopTimeoutMs`)
   * for running handlers and their outcomes; handlers still running then are aborted. Idempotent.
   */
  stop(options?: { timeoutMs?: number }): Promise<StopResult>;
  /** Resolves when the worker has stopped; rejects with the error if it stopped on a fatal loop failure. */
  wait(): Promise<void>;
  /** Listen to an event (see {@link WorkerEvents}); returns a function that removes the listener. */
  on<K extends WorkerEventName>(event: K, listener: (e: WorkerEvents[K]) => void): () => void;
  /** Like `on`, for the next occurrence only. */
  once<K extends WorkerEventName>(event: K, listener: (e: WorkerEvents[K]) => void): () => void;
  /** Rows held right now (queued, running, completing): for tests and metrics. */
  readonly held: number;
}

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));
const RETRY_WARN_INTERVAL_MS = 30_000;

/** True if `promise` settles within `ms`. The timer is cleared either way, so it never holds the process open. */
async function within(promise: Promise<unknown>, ms: number): Promise<boolean> {
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

/**
 * Deliver committed outbox rows to handlers, at least once. See DESIGN §3: fetch → bounded local queue →
 * N dispatch loops → batched, token-guarded completion, with a heartbeat renewing every held lease.
 */
export function createWorker(input: WorkerOptions): Worker {
  const options: ResolvedOptions = resolveWorkerOptions(input);
  const names = outboxNames(options.schema);
  const settings = { synchronousCommit: options.synchronousCommit };
  const fetchSql = fetchStatement(names, settings);
  const sql = completeStatements(names, settings);
  const logger: Logger =
    options.logger === false
      ? pino({ level: "silent" })
      : (options.logger ?? pino({ name: "outbox-worker" }));
  const log = logger.child({ workerId: options.workerId, schema: names.schema });
  const emitter = new WorkerEmitter((event, error) =>
    log.error({ err: error, event }, "a worker event listener threw; the worker carries on"),
  );
  const ownsPool = typeof options.connection === "string";
  const queueNames = [...options.queues.keys()];
  // Twice what one fetch or the dispatch loops need, so the next fetch runs while acks are still in flight
  // instead of waiting for them to free slots (a drain otherwise alternates fetch and ack round trips).
  const capacity = 2 * Math.max(options.batchSize, options.concurrency);
  // Deliveries, not rows: after its own lease ran out this worker can hold the same row twice (the old
  // delivery still running, the new one leased again). Keyed by the object, a late outcome or cleanup of
  // the old one can never remove the new one's entry (which would stop its heartbeat).
  const held = new Set<HeldRow>();
  const queue = new LocalQueue<HeldRow>(capacity);

  let pool: pg.Pool | undefined;
  let notifier: Notifier | undefined;
  let state: "new" | "running" | "stopping" | "stopped" = "new";
  let stopping: Promise<StopResult> | undefined;
  let fatalError: Error | undefined;
  let resolveDone!: () => void;
  let rejectDone!: (error: Error) => void;
  const done = new Promise<void>((resolve, reject) => {
    resolveDone = resolve;
    rejectDone = reject;
  });
  done.catch(() => {}); // observed through wait(); never an unhandled rejection

  const failing = new Map<LoopName, number>();
  function loopError(loop: LoopName, error: Error, consecutive: number) {
    failing.set(loop, consecutive);
    emitter.emit("loop_error", { loop, error, consecutive });
    // First failure, then every 10th: an outage must not flood the log.
    if (consecutive === 1 || consecutive % 10 === 0) {
      log.warn({ loop, consecutive, err: error }, `${loop} failed; backing off`);
    }
  }
  function loopRecovered(loop: LoopName) {
    const n = failing.get(loop);
    if (n) log.info({ loop, after: n }, `${loop} recovered`);
    failing.delete(loop);
  }
  // Failed deliveries show at the default level, one line per queue per interval: an outage of a handler's
  // target must be visible without flooding the log with a line per message.
  const retryWarnings = new Map<string, { at: number; suppressed: number }>();
  function warnRetry(queue: string, id: string, error: string) {
    const now = Date.now();
    const last = retryWarnings.get(queue);
    if (last && now - last.at < RETRY_WARN_INTERVAL_MS) {
      last.suppressed++;
      return;
    }
    retryWarnings.set(queue, { at: now, suppressed: 0 });
    log.warn(
      { queue, id, error, since: last ? { retries: last.suppressed, ms: now - last.at } : undefined },
      "deliveries failing; retrying with backoff (one line per queue every 30 s)",
    );
  }

  function fatal(error: Error) {
    if (fatalError || state !== "running") return;
    fatalError = error;
    log.error({ err: error }, "giving up after repeated failures; stopping the worker");
    emitter.emit("fatal", { error });
    void stop({ timeoutMs: Math.min(options.stopTimeoutMs, 5000) });
  }

  let prepared = options.preparedStatements;
  let warnedPollOnly = false;
  /**
   * Every statement of the worker, bounded by queryTimeoutMs: on a half-open socket (a black-holed network,
   * a failover) an answer never comes and nothing else would end the wait; pg then destroys the connection.
   */
  async function query<Row>(statement: Statement, values: unknown[]): Promise<Row[]> {
    if (!pool) throw new Error("worker is not started");
    try {
      return await run<Row>(pool, statement, values, { prepared, timeoutMs: options.queryTimeoutMs });
    } catch (error) {
      if (prepared && isPreparedStatementLost(error)) {
        // A transaction-mode pooler hands each statement to any server connection: named statements
        // cannot work there. The failed write is retried (the token makes a repeat harmless).
        prepared = false;
        log.warn(
          { err: error },
          "named prepared statements are lost between statements: a transaction-mode pooler (PgBouncer) is in between; using unnamed statements from now on (set preparedStatements: false to start that way)",
        );
      }
      throw error;
    }
  }
  // Ids come back from our fetch as decimal text and tokens are our own UUIDs: both are safe unquoted.
  const pairs = (rows: HeldRow[]) => [
    plainArray(rows.map((h) => h.row.id)),
    plainArray(rows.map((h) => h.token)),
  ];
  const keys = (rows: KeyRow[]) => new Set(rows.map((r) => r.key));

  function forget(h: HeldRow, phase: LeasePhase) {
    if (h.state === "lost" || h.state === "done") return;
    h.state = "lost";
    abortHeld(h, new Error("lease lost: another worker took this message over"));
    held.delete(h);
    queue.remove((x) => x === h);
    completer.forget(h);
    const { id, queue: q, deliveries_count: deliveries } = h.row;
    log.warn({ id, queue: q, deliveries, phase }, "lease lost; the newer owner wins");
    emitter.emit("lease_lost", { id, queue: q, deliveries, phase });
  }

  const completer = new Completer({
    batchSize: options.completionBatchSize,
    windowMs: options.completionWindowMs,
    backoffBaseMs: options.loopBackoffBaseMs,
    backoffMaxMs: options.loopBackoffMaxMs,
    maxConsecutiveFailures: options.maxConsecutiveFailures,
    ack: async (items) => {
      const [result] = await query<AckRow>(sql.ack, pairs(items.map((o) => o.held)));
      return result?.keys ? new Set(result.keys) : "all";
    },
    retry: async (items) =>
      keys(
        await query<KeyRow>(sql.retry, [
          ...pairs(items.map((o) => o.held)),
          items.map((o) => o.delayMs),
          items.map((o) => o.error),
          items.map((o) => o.failed),
          options.maxErrorLength,
        ]),
      ),
    dead: async (items) =>
      keys(
        await query<KeyRow>(sql.dead, [
          ...pairs(items.map((o) => o.held)),
          items.map((o) => o.reason),
          items.map((o) => o.error),
          items.map((o) => o.attempted),
          items.map((o) => o.failed),
          options.maxErrorLength,
        ]),
      ),
    landed: (o: Outcome) => {
      loopRecovered("complete");
      o.held.state = "done";
      held.delete(o.held);
      const { id, queue: q } = o.held.row;
      if (o.kind === "ack") {
        if (emitter.hasListeners("acked")) emitter.emit("acked", { id, queue: q, durationMs: o.durationMs });
      } else if (o.kind === "retry") {
        log.debug({ id, queue: q, delayMs: o.delayMs, error: o.error }, "retry scheduled");
        warnRetry(q, id, o.error);
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
    flushed: () => fetcher.slotsFreed(),
    onError: (error, n) => loopError("complete", error, n),
    onFatal: fatal,
  });

  const fetcher = new Fetcher<HeldRow>({
    batchSize: options.batchSize,
    minPollMs: options.minPollIntervalMs,
    maxPollMs: options.maxPollIntervalMs,
    backoffBaseMs: options.loopBackoffBaseMs,
    backoffMaxMs: options.loopBackoffMaxMs,
    maxConsecutiveFailures: options.maxConsecutiveFailures,
    free: () => capacity - queue.size - completer.pending,
    lease: async (limit) => {
      const token = randomUUID();
      const rows = await query<LeasedRow>(fetchSql, [
        queueNames,
        limit,
        token,
        options.leaseTtlMs,
        options.workerId,
      ]);
      loopRecovered("fetch");
      return rows.map((row) => ({
        row,
        token,
        state: "queued",
        writing: false,
        controller: undefined,
        startedAt: 0,
      }));
    },
    deliver: (batch) => {
      if (queue.closed) {
        // A lease that outlived the stop's wait for it (a slow round trip): give the rows straight back.
        void release(batch);
        return;
      }
      for (const h of batch) held.add(h);
      queue.push(batch);
      emitter.emit("fetched", { count: batch.length });
    },
    onError: (error, n) => loopError("fetch", error, n),
    onFatal: fatal,
  });
  queue.onTake = (sizeAfter) => {
    // Refill at half capacity: fetching one row per freed slot would cost a round trip per message.
    if (sizeAfter <= Math.floor(capacity / 2)) fetcher.slotsFreed();
  };

  const heartbeat = new Heartbeat({
    intervalMs: options.heartbeatMs,
    collect: () => {
      // While outcome writes fail, their rows are not renewed: a lease kept alive for an outcome that
      // cannot be written would lock the row to this worker for as long as the writes keep failing.
      const stalled = completer.failing;
      const rows: HeldRow[] = [];
      for (const h of held) {
        if (h.writing || h.state === "done" || h.state === "lost") continue;
        if (stalled && h.state === "completing") continue;
        rows.push(h);
      }
      return rows;
    },
    renew: async (rows) => keys(await query<KeyRow>(sql.renew, [...pairs(rows), options.leaseTtlMs])),
    lost: (h) => forget(h, "heartbeat"),
    onError: (error, n) => loopError("heartbeat", error, n),
    onRecovered: () => loopRecovered("heartbeat"),
  });

  const dispatcher = new Dispatcher({
    queue,
    concurrency: options.concurrency,
    queues: options.queues,
    maxDeliveries: options.maxDeliveries,
    retry: options.retry,
    maxErrorLength: options.maxErrorLength,
    submit: (o) => completer.submit(o),
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

  async function start(): Promise<void> {
    if (state !== "new") throw new Error(`worker cannot start: it is ${state}`);
    state = "running";
    // Whatever a driver error echoes of these URLs is masked in logs and stored errors.
    registerUrlSecrets(typeof options.connection === "string" ? options.connection : undefined);
    registerUrlSecrets(options.listenConnection);
    if (typeof options.connection === "string") {
      pool = new pg.Pool({
        connectionString: options.connection,
        // fetch, three completion kinds side by side, heartbeat, and a spare for release on stop
        max: options.poolSize,
        application_name: `outbox-worker ${options.workerId}`.slice(0, 63),
        keepAlive: true,
        // Connecting is a round trip too: bounded like the statements (a black-holed host never answers).
        connectionTimeoutMillis: options.queryTimeoutMs,
      });
    } else {
      pool = options.connection;
    }
    // An idle client killed by the server emits 'error' on the pool; unhandled, it would crash the process.
    pool.on("error", (error) =>
      log.warn({ err: error }, "idle database connection failed; the pool replaces it"),
    );
    log.info(
      {
        queues: queueNames,
        concurrency: options.concurrency,
        batchSize: options.batchSize,
        leaseTtlMs: options.leaseTtlMs,
        database:
          typeof options.connection === "string" ? redactConnectionString(options.connection) : "pool",
      },
      "worker starting",
    );
    dispatcher.start();
    heartbeat.start();
    if (options.listen) {
      const connectionString =
        options.listenConnection ??
        (typeof options.connection === "string" ? options.connection : pool.options.connectionString);
      if (!connectionString) {
        log.warn("listen is on but the pool has no connectionString: pass listenConnection; polling only");
      } else {
        notifier = createNotifier({
          connectionString,
          channel: names.channel,
          queues: new Set(queueNames),
          applicationName: `outbox-listen ${options.workerId}`.slice(0, 63),
          onWake: () => fetcher.trigger(),
          // Notifications sent while the listener was away are gone: look now.
          onReconnected: () => fetcher.trigger(),
          onStateChange: (s, detail) => {
            if (s === "poll_only" && !warnedPollOnly) {
              // Once per worker, at warn: it is a deployment fact (a pooler), not an incident to repeat.
              warnedPollOnly = true;
              log.warn(
                { listener: s, detail, maxPollIntervalMs: options.maxPollIntervalMs },
                `LISTEN gets no notifications: a transaction-mode pooler (PgBouncer) accepts LISTEN but never delivers. Polling only: pickup latency rises from milliseconds to up to maxPollIntervalMs (${options.maxPollIntervalMs} ms). Point listenConnection (service: OUTBOX_LISTEN_URL) at the database or a session-mode pooler to get wake-ups back`,
              );
            } else {
              log.info({ listener: s, detail }, `listener ${s}`);
            }
            emitter.emit("listener", { state: s, detail });
          },
          onError: (error) => log.debug({ err: error }, "listener error"),
        });
        await notifier.start();
      }
    }
    // LISTEN first, then the first fetch: a row committed in between is either seen by that fetch or
    // announced to a listener that is already there, never neither.
    fetcher.start();
    emitter.emit("started", { workerId: options.workerId, queues: queueNames });
  }

  async function release(rows: HeldRow[]): Promise<number> {
    if (rows.length === 0) return 0;
    for (let attempt = 1; ; attempt++) {
      try {
        const back = keys(await query<KeyRow>(sql.release, pairs(rows)));
        for (const h of rows) {
          h.state = "done";
          held.delete(h);
        }
        emitter.emit("released", { count: back.size });
        return back.size;
      } catch (error) {
        loopError("release", error as Error, attempt);
        // Unreleased rows are not lost: their leases expire and another worker takes them.
        if (attempt >= 3) return 0;
        await sleep(200 * attempt);
      }
    }
  }

  async function shutdown(timeoutMs: number): Promise<StopResult> {
    const deadline = Date.now() + timeoutMs;
    const left = () => Math.max(0, deadline - Date.now());
    // Bookkeeping writes (handing back unstarted rows, the last outcomes) get at least this long.
    const writeGrace = () => Math.max(1000, left());
    log.info({ timeoutMs }, "worker stopping: no new leases");
    // Every wait here is bounded: a statement stuck on a dead connection ends by its own query timeout, and
    // stop() must not wait for that. What it was doing is then left to the leases' expiry.
    await within(Promise.all([fetcher.stop(), notifier?.stop()]), writeGrace());
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
      const rows = dispatcher.abandon(new Error("worker stop timeout"));
      for (const h of rows) {
        h.state = "lost";
        held.delete(h);
      }
      abandoned = rows.map((h) => h.row.id);
      log.warn({ abandoned }, "stop timeout: handlers aborted, their leases are left to expire");
      emitter.emit("drain_timeout", { abandoned });
    }
    const flushed = await within(completer.idle(), writeGrace());
    completer.stop();
    await within(heartbeat.stop(), left());
    if (ownsPool) await within(pool?.end().catch(() => {}) ?? Promise.resolve(), left());
    const drained = finished && flushed && completer.pending === 0;
    return { drained, released, abandoned };
  }

  function stop(opts: { timeoutMs?: number } = {}): Promise<StopResult> {
    if (stopping) return stopping;
    if (state === "new") {
      state = "stopped";
      resolveDone();
      return Promise.resolve({ drained: true, released: 0, abandoned: [] });
    }
    state = "stopping";
    stopping = shutdown(opts.timeoutMs ?? options.stopTimeoutMs).then((result) => {
      state = "stopped";
      log.info(result, result.drained ? "worker stopped" : "worker stopped without draining");
      emitter.emit("stopped", { drained: result.drained });
      if (fatalError) rejectDone(fatalError);
      else resolveDone();
      return result;
    });
    return stopping;
  }

  return {
    id: options.workerId,
    start,
    stop,
    wait: () => done,
    on: (event, listener) => emitter.on(event, listener),
    once: (event, listener) => emitter.once(event, listener),
    get held() {
      return held.size;
    },
  };
}
