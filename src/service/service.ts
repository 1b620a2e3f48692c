import pg from "pg";
import type { Logger } from "pino";
import { type ConsoleHandler, createConsole } from "../console/console.js";
import { createHistory } from "../console/history.js";
import { describeDatabase } from "../console/outage.js";
import { OutboxError } from "../contract/errors.js";
import { FOLLOW_UPS_REFUSED } from "../contract/follow-up.js";
import type { Handler, QueueConfig } from "../contract/handler.js";
import { type EmbeddedPostgresHandle, startEmbeddedPostgres } from "../embedded/embedded-postgres.js";
import { migrate } from "../migrate/migrator.js";
import { defaultEventSource } from "../relay/cloudevents.js";
import { createRelay } from "../relay/create-relay.js";
import type { Relay } from "../relay/relay.js";
import type { GrantOption } from "../sql/grants.js";
import { redactConnectionString, registerUrlSecrets } from "../util/redact.js";
import { defaultQueryTimeoutMs } from "../worker/options.js";
import { createWorker, type StopResult, type Worker } from "../worker/worker.js";
import { ConfigError, crossFieldProblems, type ServiceConfig } from "./config.js";
import { createDeadLetterRetention, type DeadLetterRetention } from "./dead-letter-retention.js";
import { loadHandlersModule, type QueueHandlers } from "./handlers-module.js";
import { startHttpServer } from "./http-server.js";
import { createMetrics } from "./metrics.js";
import { createReadiness } from "./readiness.js";
import { createRelayStatus } from "./relay-status.js";
import { registerConfigSecrets } from "./secrets.js";
import { checkSchema, StartupError, waitForDatabase, warnIfNotVacuumed } from "./startup.js";
import { createUnservedQueueWatch, type UnservedQueueWatch } from "./unserved-queues.js";

export interface RunningService {
  worker: Worker;
  /** The HTTP port actually bound, when the server is on. */
  httpPort: number | undefined;
  /** Graceful: stop leasing, finish handlers within the timeout, release the rest, close everything. */
  stop(): Promise<StopResult>;
}

/** Everything `outbox-worker run` starts, in dependency order; `stop` closes it in reverse. */
export async function startService(config: ServiceConfig, log: Logger): Promise<RunningService> {
  // First, so that no log line or stored error of this process can show one of them.
  registerConfigSecrets(config);
  // A config built in code skips loadServiceConfig: the same checks between fields, before anything starts.
  const crossField = crossFieldProblems(config);
  if (crossField.length) throw new ConfigError(crossField);
  // Handlers and relays first: a wrong module or relay is a config error, reported before connecting.
  const handlers: QueueHandlers = config.handlers ? await loadHandlersModule(config.handlers) : {};
  const clash = Object.keys(config.relays).filter((q) => q in handlers);
  if (clash.length) {
    throw new ConfigError(
      clash.map((q) => `relays.${q} (OUTBOX_RELAYS): queue "${q}" also has a handler in the handlers module`),
    );
  }
  if (Object.keys(handlers).length + Object.keys(config.relays).length === 0) {
    throw new ConfigError([
      "handlers (OUTBOX_HANDLERS) / relays (OUTBOX_RELAYS): nothing to serve: name a handlers module or configure a relay",
    ]);
  }
  // A service declares the subscriptions of its own queues only: another service's are its own business.
  const unserved = Object.keys(config.subscriptions).filter((q) => !(q in handlers || q in config.relays));
  if (unserved.length) {
    throw new ConfigError(
      unserved.map(
        (q) =>
          `subscriptions.${q} (OUTBOX_SUBSCRIPTIONS): queue "${q}" is not served here (no handler in the handlers module, no relay); subscribe another service's queue with outbox-worker subscribe`,
      ),
    );
  }

  const closers: (() => Promise<unknown>)[] = [];
  const closeAll = async () => {
    for (const close of closers.reverse())
      await close().catch((error) => log.warn({ err: error }, "close failed"));
  };
  try {
    let url = config.databaseUrl;
    let embedded: EmbeddedPostgresHandle | undefined;
    if (!url) {
      log.info({ dataDir: config.dataDir }, "no DATABASE_URL: starting the embedded Postgres");
      embedded = await startEmbeddedPostgres({
        dataDir: config.dataDir,
        persistent: true,
        handleSignals: false,
        onNotice: (message) => log.info(message),
        onLog: (line) => log.debug({ postgres: line.trim() }, "embedded postgres"),
      });
      closers.push(() => (embedded as EmbeddedPostgresHandle).stop());
      url = embedded.url;
      registerUrlSecrets(url);
    }
    log.info({ database: redactConnectionString(url), schema: config.schema }, "database");
    const queryTimeoutMs = config.worker.queryTimeoutMs ?? defaultQueryTimeoutMs(config.worker.leaseTtlMs);
    const pool = new pg.Pool({
      connectionString: url,
      // The worker's connections plus two for readiness and the metrics gauges, and one for the
      // dead-letter retention when it is on, so its batches never take a connection the worker counts on.
      // Plus one per dispatch loop when a handler runs in its ack's transaction (it holds its connection).
      max:
        config.worker.poolSize +
        2 +
        (config.deadLetterRetentionMs === undefined ? 0 : 1) +
        (Object.values(handlers).some((e) => typeof e !== "function" && e.transaction === true)
          ? config.worker.concurrency
          : 0),
      application_name: "outbox-worker",
      keepAlive: true,
      // Readiness and metrics share this pool with the worker: their round trips are bounded like the
      // worker's, or a black-holed connection would keep its client forever and starve the worker.
      connectionTimeoutMillis: queryTimeoutMs,
      query_timeout: queryTimeoutMs,
    });
    pool.on("error", (error) =>
      log.warn({ err: error }, "idle database connection failed; the pool replaces it"),
    );
    closers.push(() => pool.end());

    // Before anything says "running": fail fast on what no retry fixes, wait (bounded) for a server not up yet.
    await waitForDatabase({ pool, schema: config.schema, waitMs: config.startupWaitMs, log });
    if (config.migrate || embedded) {
      const result = await migrate({ connection: url, schema: config.schema });
      log.info({ applied: result.applied.map((m) => m.name), version: result.version }, "migrations checked");
    }
    // The rights of what this service is configured to do, each missing one named with its grant option.
    // Follow-ups cannot be known before a handler returns one: checked, said once, never required.
    const need: GrantOption[] = ["--worker"];
    if (config.deadLetterRetentionMs !== undefined) need.push("--worker-can-expire");
    if (declaresSubscriptions(handlers, config)) need.push("--worker-can-subscribe");
    const optional = (
      ["--worker-can-follow-up", "--worker-can-expire", "--worker-can-subscribe"] as const
    ).filter((o) => !need.includes(o));
    const rights = await checkSchema({ pool, schema: config.schema, need, optional });
    if (rights.missingOptional.includes("--worker-can-follow-up")) {
      log.info(
        { role: rights.role },
        `follow-ups off: this role may not insert messages, so a handler's follow-ups are refused and its message is dead-lettered (${FOLLOW_UPS_REFUSED}); outbox-worker grant --worker ${rights.role} --worker-can-follow-up allows them`,
      );
    }
    await warnIfNotVacuumed(pool, config.schema, log);

    const relays: Record<string, Relay> = {};
    closers.push(() => Promise.all(Object.values(relays).map((r) => r.close())));
    const queues: QueueHandlers = {};
    for (const [queue, entry] of Object.entries(handlers)) {
      queues[queue] = withSubscriptions(entry, config.subscriptions[queue]);
    }
    for (const [queue, relayConfig] of Object.entries(config.relays)) {
      const relay = await createRelay(relayConfig, {
        // The relay binds its own `relay` field: binding it here too wrote the key twice in every line.
        logger: log.child({ queue }),
        queue,
        source: defaultEventSource(url, config.schema),
      });
      relays[queue] = relay;
      // Relays forward the stored JSON text as it is: no parse, no lost digits.
      queues[queue] = withSubscriptions(
        {
          handler: relay.handler,
          rawPayload: true,
          ordered: relayConfig.ordered,
          subscribe: relayConfig.subscribe,
          announceFailures: relayConfig.announceFailures,
        },
        config.subscriptions[queue],
      );
    }

    const worker = createWorker({
      ...config.worker,
      workerId: config.workerId,
      connection: pool,
      // Behind a transaction-mode pooler LISTEN never hears anything: listenUrl can bypass it.
      listenConnection: config.listenUrl ?? url,
      schema: config.schema,
      queues,
      logger: log,
    });

    let retention: DeadLetterRetention | undefined;
    if (config.deadLetterRetentionMs !== undefined) {
      retention = createDeadLetterRetention({
        pool,
        schema: config.schema,
        retentionMs: config.deadLetterRetentionMs,
        queryTimeoutMs,
        logger: log,
      });
      closers.push(() => (retention as DeadLetterRetention).stop());
    }

    let httpPort: number | undefined;
    let markStopping = () => {};
    if (config.http.port !== undefined) {
      const metrics = createMetrics({
        pool,
        schema: config.schema,
        gaugeIntervalMs: config.http.gaugeIntervalMs,
        logger: log,
      });
      const readiness = createReadiness({
        pool,
        schema: config.schema,
        listen: config.worker.listen,
      });
      // The relays' reach has an endpoint, a gauge and a console panel of its own, never readiness.
      const relayStatus = createRelayStatus({ relays });
      metrics.observe(worker);
      metrics.observeRelays(relayStatus);
      if (retention) metrics.observeRetention(retention);
      readiness.observe(worker);
      // /readyz turns 503 as soon as a stop begins, so a load balancer stops sending work here.
      markStopping = () => readiness.markStopping();
      metrics.start();
      closers.push(() => metrics.stop());
      let consoleHandler: ConsoleHandler | undefined;
      if (config.console.enabled) {
        // Its own two connections: a page left open, or a slow dead-letter scan, never takes one the
        // worker counts on.
        const consolePool = new pg.Pool({
          connectionString: url,
          max: 2,
          application_name: "outbox-console",
          connectionTimeoutMillis: queryTimeoutMs,
          query_timeout: Math.max(queryTimeoutMs, 10_000),
        });
        consolePool.on("error", (error) => log.warn({ err: error }, "idle console connection failed"));
        closers.push(() => consolePool.end());
        const history = createHistory({ db: consolePool, schema: config.schema, logger: log });
        history.observe(worker);
        history.start();
        closers.push(() => history.stop());
        consoleHandler = createConsole({
          db: consolePool,
          schema: config.schema,
          pathPrefix: config.console.pathPrefix,
          writeToken: config.console.writeToken,
          readToken: config.console.readToken,
          history,
          relays: relayStatus,
          logger: log,
          bindHost: config.http.host,
          allowedHosts: config.console.allowedHosts,
          database: describeDatabase(url),
        });
        closers.push(async () => consoleHandler?.close());
      }
      const server = await startHttpServer({
        port: config.http.port,
        host: config.http.host,
        metrics,
        readiness,
        relays: relayStatus,
        logger: log,
        console: consoleHandler,
      });
      closers.push(() => server.close());
      httpPort = server.port;
      log.info(
        {
          port: httpPort,
          host: config.http.host,
          // Whether writes are possible, never the tokens themselves.
          console: consoleHandler
            ? {
                path: config.console.pathPrefix,
                writes: config.console.writeToken !== undefined,
                readToken: config.console.readToken !== undefined,
              }
            : false,
        },
        `http server listening: /healthz /readyz /relays /metrics${consoleHandler ? ` ${config.console.pathPrefix}/` : ""}`,
      );
    }

    try {
      // Applies every queue's subscriptions before the first fetch.
      await worker.start();
    } catch (error) {
      // A subscription the worker's role may not make: one line saying which grant, as a missing privilege.
      if (error instanceof OutboxError) throw new StartupError(error.message);
      throw error;
    }
    retention?.start();
    let unserved: UnservedQueueWatch | undefined;
    if (config.unservedQueueWarnMs > 0) {
      // From the database alone: right however many services serve which queues (README "Unserved queues").
      // One short statement per interval, on the connections readiness and the gauges share.
      unserved = createUnservedQueueWatch({
        pool,
        schema: config.schema,
        warnAfterMs: config.unservedQueueWarnMs,
        intervalMs: config.http.gaugeIntervalMs,
        servedHere: new Set(Object.keys(queues)),
        queryTimeoutMs,
        logger: log,
      });
      unserved.start();
      closers.push(() => (unserved as UnservedQueueWatch).stop());
    }
    let stopping: Promise<StopResult> | undefined;
    return {
      worker,
      httpPort,
      stop: () => {
        markStopping();
        // A stop hands rows back and holds no lease: that is not a queue left unserved.
        void unserved?.stop();
        stopping ??= worker.stop({ timeoutMs: config.worker.stopTimeoutMs }).finally(closeAll);
        return stopping;
      },
    };
  } catch (error) {
    await closeAll();
    throw error;
  }
}

/** Whether any served queue declares subscriptions (applied at start, which needs --worker-can-subscribe). */
function declaresSubscriptions(handlers: QueueHandlers, config: ServiceConfig): boolean {
  const declared = (list: readonly unknown[] | undefined) => (list?.length ?? 0) > 0;
  return (
    Object.values(config.subscriptions).some(declared) ||
    Object.values(config.relays).some((r) => declared(r.subscribe)) ||
    Object.values(handlers).some((e) => typeof e !== "function" && declared(e.subscribe))
  );
}

/** A queue's entry with the config's `subscriptions` for it added to its own `subscribe` (the worker dedupes). */
function withSubscriptions(
  entry: Handler | QueueConfig,
  extra: readonly string[] | undefined,
): Handler | QueueConfig {
  if (!extra?.length) return entry;
  if (typeof entry === "function") return { handler: entry, subscribe: extra };
  return { ...entry, subscribe: [...(entry.subscribe ?? []), ...extra] };
}
