import type pg from "pg";
import { migrationState } from "../migrate/migrator.js";
import type { ListenerState } from "../notify/notifier.js";
import { runQuery } from "../sql/executor.js";
import { pingStatement } from "../sql/probes.js";
import { registerSecrets, registerUrlSecrets, scrubSecrets } from "../util/redact.js";
import type { Worker } from "../worker/worker.js";
import { timeBound } from "./time-bound.js";

export interface ReadinessOptions {
  pool: pg.Pool;
  schema: string;
  /** Whether the worker LISTENs; when off the listener check always passes. */
  listen: boolean;
  /** Bound on each database round trip of a check. */
  timeoutMs?: number;
}

export type WorkerState = "new" | "running" | "stopping" | "stopped" | "fatal";

/**
 * What `/readyz` answers: whether this worker can do its work, which needs the database and nothing
 * else. A relay's broker being down is not here (see relay-status.ts): it would take every replica out
 * of rotation at once for an outage none of them can fix.
 */
export interface ReadinessReport {
  ready: boolean;
  checks: {
    database: { ok: boolean; error?: string };
    migrations: { ok: boolean; pending?: number[]; error?: string };
    listener: { ok: boolean; state: ListenerState | "disabled"; note?: string };
    worker: { ok: boolean; state: WorkerState; error?: string };
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

  const within = <T>(promise: Promise<T>, what: string) => timeBound(promise, timeoutMs, what);

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

  async function run(): Promise<ReadinessReport> {
    const [db, mig] = await Promise.all([database(), migrations()]);
    const checks = { database: db, migrations: mig, listener: listener(), worker: worker() };
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
