import type pg from "pg";
import { migrationState } from "../migrate/migrator.js";
import type { ListenerState } from "../notify/notifier.js";
import type { RelayHealth } from "../relay/health.js";
import type { Relay } from "../relay/relay.js";
import { runQuery } from "../sql/executor.js";
import { pingStatement } from "../sql/probes.js";
import { registerSecrets, registerUrlSecrets, scrubSecrets } from "../util/redact.js";
import type { Worker } from "../worker/worker.js";

export interface ReadinessOptions {
  pool: pg.Pool;
  schema: string;
  /** Whether the worker LISTENs; when off the listener check always passes. */
  listen: boolean;
  /** Bound on each database round trip of a check, and on each relay's probe. */
  timeoutMs?: number;
  /** Built-in relays by queue: ready only while each can reach its target and the target exists. */
  relays?: Record<string, Pick<Relay, "kind" | "health">>;
}

/** One relay in the report: its type and health. */
export type RelayReport = { type: string } & RelayHealth;

export type WorkerState = "new" | "running" | "stopping" | "stopped" | "fatal";

export interface ReadinessReport {
  ready: boolean;
  checks: {
    database: { ok: boolean; error?: string };
    migrations: { ok: boolean; pending?: number[]; error?: string };
    listener: { ok: boolean; state: ListenerState | "disabled"; note?: string };
    worker: { ok: boolean; state: WorkerState; error?: string };
    relays: { ok: boolean; relays: Record<string, RelayReport> };
  };
}

export interface Readiness {
  /** Track the worker's lifecycle and listener. Call it before `worker.start()`: earlier events are not replayed. */
  observe(worker: Worker): () => void;
  /** Report not ready from now on, e.g. on SIGTERM before `worker.stop()`, which emits nothing until it ends. */
  markStopping(): void;
  check(): Promise<ReadinessReport>;
}

const DEFAULT_TIMEOUT_MS = 2000;

export function createReadiness(opts: ReadinessOptions): Readiness {
  const timeoutMs = opts.timeoutMs ?? DEFAULT_TIMEOUT_MS;
  // The pool's own credentials, for a driver error that quotes one; the service registered the rest.
  registerUrlSecrets(opts.pool.options.connectionString);
  const { password } = opts.pool.options;
  if (typeof password === "string") registerSecrets(password);
  let listenerState: ListenerState = "connecting";
  let workerState: WorkerState = "new";
  let fatalError: string | undefined;
  let inflight: Promise<ReadinessReport> | undefined;

  /** Error text safe to serve: no credential of any URL and no registered secret, even when a driver echoes one. */
  function describe(error: unknown): string {
    return scrubSecrets(error instanceof Error ? error.message : String(error));
  }

  function within<T>(promise: Promise<T>, what: string): Promise<T> {
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new Error(`${what} timed out after ${timeoutMs} ms`)), timeoutMs);
    });
    // The losing promise still settles later; its rejection must not become an unhandled one.
    promise.catch(() => {});
    return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
  }

  async function database(): Promise<ReadinessReport["checks"]["database"]> {
    try {
      await within(runQuery(opts.pool, pingStatement, {}), "database check");
      return { ok: true };
    } catch (error) {
      return { ok: false, error: describe(error) };
    }
  }

  async function migrations(): Promise<ReadinessReport["checks"]["migrations"]> {
    try {
      const state = await within(
        migrationState({ connection: opts.pool, schema: opts.schema }),
        "migration check",
      );
      return state.current ? { ok: true } : { ok: false, pending: state.pending };
    } catch (error) {
      return { ok: false, error: describe(error) };
    }
  }

  function listener(): ReadinessReport["checks"]["listener"] {
    if (!opts.listen) return { ok: true, state: "disabled" };
    if (listenerState === "listening") return { ok: true, state: listenerState };
    if (listenerState === "poll_only") {
      return { ok: true, state: listenerState, note: "notifications do not arrive; serving by polling" };
    }
    return { ok: false, state: listenerState };
  }

  function worker(): ReadinessReport["checks"]["worker"] {
    if (workerState === "fatal") return { ok: false, state: workerState, error: fatalError };
    return { ok: workerState === "running", state: workerState };
  }

  async function relays(): Promise<ReadinessReport["checks"]["relays"]> {
    const entries = await Promise.all(
      Object.entries(opts.relays ?? {}).map(async ([queue, relay]): Promise<[string, RelayReport]> => {
        try {
          const health = await within(relay.health(), `relay ${queue} check`);
          const report = { type: relay.kind, ...health };
          if (report.error !== undefined) report.error = describe(report.error);
          return [queue, report];
        } catch (error) {
          return [queue, { type: relay.kind, state: "unreachable", target: "", error: describe(error) }];
        }
      }),
    );
    // An unreachable broker or a target that cannot exist: this worker cannot deliver those queues.
    return { ok: entries.every(([, r]) => r.state === "ok"), relays: Object.fromEntries(entries) };
  }

  async function run(): Promise<ReadinessReport> {
    const [db, mig, rel] = await Promise.all([database(), migrations(), relays()]);
    const checks = { database: db, migrations: mig, listener: listener(), worker: worker(), relays: rel };
    return { ready: Object.values(checks).every((c) => c.ok), checks };
  }

  return {
    observe(w) {
      const offs = [
        w.on("started", () => {
          if (workerState === "new") workerState = "running";
        }),
        w.on("listener", (e) => {
          listenerState = e.state;
          // The listener stops first thing in stop(): the earliest sign the worker is going away.
          if (e.state === "stopped" && workerState === "running") workerState = "stopping";
        }),
        w.on("fatal", (e) => {
          workerState = "fatal";
          fatalError = describe(e.error);
        }),
        w.on("stopped", () => {
          if (workerState !== "fatal") workerState = "stopped";
        }),
      ];
      return () => {
        for (const off of offs) off();
      };
    },
    markStopping() {
      if (workerState === "new" || workerState === "running") workerState = "stopping";
    },
    check() {
      // Probes may come faster than a slow database answers: share one check instead of piling them up.
      inflight ??= run().finally(() => {
        inflight = undefined;
      });
      return inflight;
    },
  };
}
