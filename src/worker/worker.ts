import pg from "pg";
import pino, { type Logger } from "pino";
import { OutboxError } from "../contract/errors.js";
import { createBatchLeaser } from "../lease/pg-batch.js";
import { createPgLeaseStore } from "../lease/pg-store.js";
import { createNotifier, type Notifier } from "../notify/notifier.js";
import { runQuery } from "../sql/executor.js";
import { outboxNames } from "../sql/names.js";
import { serverStartedStatement } from "../sql/probes.js";
import { redactConnectionString, registerUrlSecrets } from "../util/redact.js";
import { applySubscriptions } from "./apply-subscriptions.js";
import { createBatchEngine } from "./batch-engine.js";
import { confirmedForMs } from "./confirmed-for.js";
import { createEngine, type StopResult, within } from "./engine.js";
import { EventLoopWatch } from "./event-loop-watch.js";
import { WorkerEmitter, type WorkerEventName, type WorkerEvents } from "./events.js";
import { GuardRepair } from "./guard-repair.js";
import { createPgInbox } from "./inbox.js";
import { createInboxRetention } from "./inbox-retention.js";
import { KeyHeadRepair } from "./key-head-repair.js";
import { LoopHealth } from "./loop-health.js";
import { type ResolvedOptions, resolveWorkerOptions, type WorkerOptions } from "./options.js";
import { poolerInBetween, unnamedStatementsReason } from "./pooler-probe.js";
import { RestartWatch } from "./restart-watch.js";

export type { StopResult };

/** A running outbox consumer, made by {@link createWorker}. */
export interface Worker {
  /** Its `workerId`, written to `acquired_by` on the rows it leases. */
  readonly id: string;
  /**
   * Connect, subscribe the queues to the topics their `subscribe` lists name (those not subscribed yet),
   * LISTEN and start fetching. Call once. Rejects, and the worker is stopped, when a subscription cannot
   * be made (the error names the queue's field, and the grant when a right is missing).
   */
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

/**
 * Deliver committed outbox rows to handlers, at least once. See DESIGN §3: fetch → bounded local queue →
 * N dispatch loops → batched, token-guarded completion, with a heartbeat renewing every held lease.
 */
export function createWorker(input: WorkerOptions): Worker {
  const options: ResolvedOptions = resolveWorkerOptions(input);
  const names = outboxNames(options.schema);
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
  const unorderedQueueNames = [...options.queues.values()].filter((q) => !q.ordered).map((q) => q.name);
  // Each transactional handler holds a pooled connection for its whole run: up to `concurrency` of them.
  const transactionSlots = [...options.queues.values()].some((q) => q.transaction) ? options.concurrency : 0;

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

  function fatal(error: Error) {
    if (fatalError || state !== "running") return;
    fatalError = error;
    log.error({ err: error }, "giving up after repeated failures; stopping the worker");
    emitter.emit("fatal", { error });
    void stop({ timeoutMs: Math.min(options.stopTimeoutMs, 5000) });
  }

  const announceFailures = new Map(
    [...options.queues.values()].flatMap((q) => (q.announceFailures ? [[q.name, q.announceFailures]] : [])),
  );
  const store = createPgLeaseStore({
    pool: () => {
      if (!pool) throw new OutboxError("worker is not started");
      return pool;
    },
    names,
    queues: queueNames,
    unorderedQueues: unorderedQueueNames,
    announceFailures,
    workerId: options.workerId,
    leaseTtlMs: options.leaseTtlMs,
    maxErrorLength: options.maxErrorLength,
    synchronousCommit: options.synchronousCommit,
    preparedStatements: options.preparedStatements,
    queryTimeoutMs: options.queryTimeoutMs,
    onPromoted: () => engine.wake(),
    onKeyBusy: (heads) =>
      log.debug(
        { heads },
        "key heads kept in place: a producer of their key has not committed yet; completing them shortly",
      ),
    onPreparedLost: preparedLost,
  });
  // Named statements until a pooler shows it loses them: the token store and the batch leaser alike.
  let named = options.preparedStatements;
  function preparedLost(error: unknown): void {
    if (named) {
      log.warn(
        { err: error },
        "named prepared statements are lost between statements: a transaction-mode pooler (PgBouncer) is in between; using unnamed statements from now on (set preparedStatements: false to start that way)",
      );
    }
    named = false;
    store.useUnnamedStatements();
  }
  const workerPool = () => {
    if (!pool) throw new OutboxError("worker is not started");
    return pool;
  };
  // Only when a queue has an inbox: the others never run an inbox statement.
  const inboxQueues = [...options.queues.values()].filter((q) => q.inbox !== undefined).map((q) => q.name);
  const inbox =
    inboxQueues.length === 0
      ? undefined
      : createPgInbox({
          pool: workerPool,
          names,
          synchronousCommit: options.synchronousCommit,
          queryTimeoutMs: options.queryTimeoutMs,
        });
  const inboxRetention =
    inboxQueues.length === 0
      ? undefined
      : createInboxRetention({
          pool: workerPool,
          names,
          retentionMs: options.inboxRetentionMs,
          queryTimeoutMs: options.queryTimeoutMs,
          log,
        });
  const health = new LoopHealth(log, emitter);
  const engine =
    options.leaseMode === "transaction"
      ? createBatchEngine({
          options,
          leaser: createBatchLeaser({
            pool: workerPool,
            names,
            queues: queueNames,
            unorderedQueues: unorderedQueueNames,
            workerId: options.workerId,
            maxErrorLength: options.maxErrorLength,
            synchronousCommit: options.synchronousCommit,
            preparedStatements: () => named,
            queryTimeoutMs: options.queryTimeoutMs,
            // The server ends a batch's transaction idle for a lease TTL: a worker cut off from it (a
            // half-open socket, a frozen process) keeps nothing locked for longer than a token lease would.
            // A live worker's batches never idle that long, however long their rows wait for a slot: the
            // engine sends each one a keep-alive every heartbeat.
            idleTimeoutMs: options.leaseTtlMs,
            confirmedForMs: confirmedForMs(options),
            announceFailures,
            onPromoted: () => engine.wake(),
            onPreparedLost: preparedLost,
          }),
          repair: new GuardRepair({
            pool: workerPool,
            names,
            intervalMs: options.leaseTtlMs,
            queryTimeoutMs: options.queryTimeoutMs,
            log,
          }),
          log,
          emitter,
          health,
          onFatal: fatal,
        })
      : createEngine({
          options,
          store,
          log,
          emitter,
          ...(inbox ? { inbox } : {}),
          health,
          onFatal: fatal,
        });
  let warnedPollOnly = false;
  const keyHeadRepair = new KeyHeadRepair({
    pool: () => {
      if (!pool) throw new OutboxError("worker is not started");
      return pool;
    },
    names,
    queues: queueNames.filter((q) => !unorderedQueueNames.includes(q)),
    intervalMs: options.keyHeadRepairIntervalMs,
    queryTimeoutMs: options.queryTimeoutMs,
    log,
  });
  // After a database crash, rows whose outcome writes it undid are taken back at once (not after the TTL).
  const restartWatch = new RestartWatch({
    serverStarted: async () => {
      if (!pool) throw new OutboxError("worker is not started");
      const [row] = await runQuery(pool, serverStartedStatement, {}, { timeoutMs: options.queryTimeoutMs });
      return row?.started ?? "";
    },
    reclaim: () => engine.reclaimStale(),
    everyMs: options.heartbeatMs,
    backoffBaseMs: options.loopBackoffBaseMs,
    backoffMaxMs: options.loopBackoffMaxMs,
    log,
  });
  emitter.on("loop_error", () => restartWatch.lostContact());
  emitter.on("listener", (e) => {
    if (e.state === "reconnecting") restartWatch.lostContact();
  });

  // A blocked loop renews nothing: past the lease, another worker may start the same rows. Said at once.
  const loopWatch = new EventLoopWatch({
    tickMs: 100,
    thresholdMs: Math.max(100, Math.min(1000, options.heartbeatMs / 2)),
    onBlocked: (blockedMs) => {
      const context = { blockedMs, heartbeatMs: options.heartbeatMs, leaseTtlMs: options.leaseTtlMs };
      if (blockedMs >= options.leaseTtlMs) {
        log.error(
          context,
          "the event loop was blocked for longer than the lease (a synchronous handler?): its leases may have run out, and another worker may run those messages too",
        );
      } else {
        log.warn(
          context,
          "the event loop was blocked (a synchronous handler?): no lease was renewed meanwhile",
        );
      }
      emitter.emit("event_loop_blocked", { blockedMs });
    },
  });

  async function start(): Promise<void> {
    if (state !== "new") throw new OutboxError(`worker cannot start: it is ${state}`);
    state = "running";
    // Whatever a driver error echoes of these URLs is masked in logs and stored errors.
    registerUrlSecrets(typeof options.connection === "string" ? options.connection : undefined);
    registerUrlSecrets(options.listenConnection);
    if (typeof options.connection === "string") {
      pool = new pg.Pool({
        connectionString: options.connection,
        // fetch, three completion kinds side by side, heartbeat, and a spare for release on stop; plus one
        // per dispatch loop when handlers run in their ack's transaction, so those never starve the rest;
        // one more with an inbox: its checks run beside the rest (one statement at a time).
        max: options.poolSize + transactionSlots + (inbox ? 1 : 0),
        application_name: `outbox-worker ${options.workerId}`.slice(0, 63),
        keepAlive: true,
        // Connecting is a round trip too: bounded like the statements (a black-holed host never answers).
        connectionTimeoutMillis: options.queryTimeoutMs,
      });
    } else {
      pool = options.connection;
      const max = pool.options.max ?? 10;
      if (transactionSlots > 0 && max < options.poolSize + transactionSlots) {
        log.warn(
          { poolMax: max, concurrency: options.concurrency, wanted: options.poolSize + transactionSlots },
          "transactional handlers each hold a pooled connection while they run: with a pool this small, fetches, renewals and acks wait for them; give the pool poolSize + concurrency connections",
        );
      }
    }
    // An idle client killed by the server emits 'error' on the pool; unhandled, it would crash the process.
    pool.on("error", (error) => {
      log.warn({ err: error }, "idle database connection failed; the pool replaces it");
      restartWatch.lostContact();
    });
    log.info(
      {
        queues: queueNames,
        unorderedQueues: unorderedQueueNames,
        ...(inbox ? { inboxQueues, inboxRetentionMs: options.inboxRetentionMs } : {}),
        concurrency: options.concurrency,
        batchSize: options.batchSize,
        leaseTtlMs: options.leaseTtlMs,
        database:
          typeof options.connection === "string" ? redactConnectionString(options.connection) : "pool",
      },
      "worker starting",
    );
    // Before the first fetch: events committed once this returns reach the queues configured to subscribe.
    if (options.subscriptions.length > 0) {
      try {
        await applySubscriptions({
          pool,
          names,
          subscriptions: options.subscriptions,
          queryTimeoutMs: options.queryTimeoutMs,
          log,
        });
      } catch (error) {
        // Nothing else has started: close what start opened, and the worker is stopped (wait() says why,
        // stop() has nothing left to do).
        state = "stopped";
        stopping = Promise.resolve({ drained: true, released: 0, abandoned: [] });
        if (ownsPool) await pool.end().catch(() => {});
        rejectDone(error as Error);
        throw error;
      }
    }
    loopWatch.start();
    engine.startDispatching();
    const poolAddress =
      typeof options.connection === "string" ? options.connection : pool.options.connectionString;
    // Alongside LISTEN's first self-test, which tells a pooler's mode: known before the first fetch, so a
    // transaction-mode pooler never sees a named statement (each would fail once, as a loop error).
    const pooler = options.preparedStatements ? poolerInBetween(pool, options.queryTimeoutMs) : undefined;
    let listenAddress: string | undefined;
    if (options.listen) {
      const connectionString = options.listenConnection ?? poolAddress;
      listenAddress = connectionString;
      if (!connectionString) {
        log.warn("listen is on but the pool has no connectionString: pass listenConnection; polling only");
      } else {
        notifier = createNotifier({
          connectionString,
          channel: names.channel,
          queues: new Set(queueNames),
          applicationName: `outbox-listen ${options.workerId}`.slice(0, 63),
          onWake: () => engine.wake(),
          // Notifications sent while the listener was away are gone: look now.
          onReconnected: () => engine.wake(),
          onStateChange: (s, detail) => {
            if (s === "poll_only" && !warnedPollOnly) {
              // Once per worker, at warn: it is a deployment fact (a pooler), not an incident to repeat.
              warnedPollOnly = true;
              log.warn(
                { listener: s, detail, minPollIntervalMs: options.minPollIntervalMs },
                `LISTEN gets no notifications: a transaction-mode pooler (PgBouncer) accepts LISTEN but never delivers. Polling only, every minPollIntervalMs (${options.minPollIntervalMs} ms): pickup latency rises from milliseconds to up to that. Point listenConnection (service: OUTBOX_LISTEN_URL) at the database or a session-mode pooler to get wake-ups back`,
              );
            } else {
              log.info({ listener: s, detail }, `listener ${s}`);
            }
            engine.setWakeUps(s === "listening");
            emitter.emit("listener", { state: s, detail });
          },
          onError: (error) => log.debug({ err: error }, "listener error"),
        });
        await notifier.start();
      }
    }
    if (pooler) {
      const reason = unnamedStatementsReason({
        pooler: await pooler,
        listenerOnPoolAddress: notifier && listenAddress === poolAddress ? notifier.state : undefined,
      });
      if (reason && named) {
        named = false;
        store.useUnnamedStatements();
        log.info(
          { reason },
          "a transaction-mode pooler (PgBouncer) may sit in front of Postgres: the worker's statements are unnamed from the start, since a named one prepared on one server connection is missing on the next",
        );
      }
    }
    // LISTEN first, then the first fetch: a row committed in between is either seen by that fetch or
    // announced to a listener that is already there, never neither.
    engine.startFetching();
    keyHeadRepair.start();
    restartWatch.start();
    inboxRetention?.start();
    emitter.emit("started", { workerId: options.workerId, queues: queueNames });
  }

  async function shutdown(timeoutMs: number): Promise<StopResult> {
    log.info({ timeoutMs }, "worker stopping: no new leases");
    // The listener and the restart watch stop alongside the fetcher: no wake-up matters any more.
    const result = await engine.shutdown(timeoutMs, Promise.all([notifier?.stop(), restartWatch.stop()]));
    await keyHeadRepair.stop();
    await inboxRetention?.stop();
    loopWatch.stop();
    if (ownsPool) await within(pool?.end().catch(() => {}) ?? Promise.resolve(), Math.max(1000, timeoutMs));
    return result;
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
      return engine.held;
    },
  };
}
