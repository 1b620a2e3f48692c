import type { Logger } from "pino";
import type { Outcome } from "../complete/completer.js";
import type { WorkerEmitter } from "./events.js";
import type { LoopHealth } from "./loop-health.js";

export interface OutcomeReportDeps {
  log: Logger;
  emitter: WorkerEmitter;
  health: LoopHealth;
}

/** An outcome's write landed: say so in the log, the worker's events and the loop health. */
export function reportLanded(deps: OutcomeReportDeps, o: Outcome): void {
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
