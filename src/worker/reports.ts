import type { Logger } from "pino";
import type { Outcome } from "../complete/completer.js";
import type { DispatcherDeps } from "../dispatch/dispatcher.js";
import type { WorkerEmitter } from "./events.js";
import type { LoopHealth } from "./loop-health.js";

/** What the engine does, said in the log, the worker's events and the loop health. */
export interface ReportDeps {
  log: Logger;
  emitter: WorkerEmitter;
  health: LoopHealth;
}

/** An outcome's write landed: say so in the log, the worker's events and the loop health. */
export function reportLanded(deps: ReportDeps, o: Outcome): void {
  const { log, emitter, health } = deps;
  const { id, queue: q } = o.held.row;
  if (o.kind === "ack" && o.deduped && o.inbox) {
    const { consumer, key } = o.inbox;
    log.debug({ id, queue: q, consumer, key }, "already handled (inbox): acked without running the handler");
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
}

/** A completion has waited `waitedMs` on a producer of its key (told once per outcome). */
export function reportLongWait(deps: ReportDeps, o: Outcome, waitedMs: number): void {
  const { id, queue: q, key } = o.held.row;
  deps.log.warn(
    { id, queue: q, key, waitedMs },
    "completion waiting on a producer's open transaction on its key: the key goes on once it commits",
  );
}

/** The dispatcher's reports: a delivery started, a retry strategy's unusable delay, a handler timed out. */
export function dispatchReports(
  deps: ReportDeps,
): Pick<DispatcherDeps, "dispatched" | "strategyProblem" | "timedOut"> {
  const { log, emitter } = deps;
  return {
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
  };
}
