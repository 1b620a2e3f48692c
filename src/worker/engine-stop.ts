import type { Logger } from "pino";
import type { Completer } from "../complete/completer.js";
import type { Heartbeat } from "../complete/heartbeat.js";
import type { Dispatcher } from "../dispatch/dispatcher.js";
import type { LocalQueue } from "../dispatch/local-queue.js";
import type { Fetcher } from "../fetch/fetcher.js";
import type { HeldRow } from "../lease/held.js";
import type { WorkerEmitter } from "./events.js";
import type { HandBack } from "./hand-back.js";
import type { HeldSet } from "./held-set.js";

/** How {@link Worker.stop} went: whether the worker drained, or what it left behind. */
export interface StopResult {
  /** True when every handler finished within the timeout and every outcome was written. */
  drained: boolean;
  /** Rows fetched but never started, handed back for another worker. */
  released: number;
  /** Handlers still running at the timeout: aborted, their leases left to expire. */
  abandoned: string[];
}

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

/** The engine's pieces, in the order the stop ends them. */
export interface EngineParts {
  fetcher: Fetcher<HeldRow>;
  queue: LocalQueue<HeldRow>;
  handBack: HandBack;
  dispatcher: Dispatcher;
  held: HeldSet;
  completer: Completer;
  heartbeat: Heartbeat;
  log: Logger;
  emitter: WorkerEmitter;
}

/**
 * The stop, the way the rows flow: no new leases (with `alongside`, e.g. the LISTEN connection's end),
 * unstarted rows handed back, handlers waited for (aborted at the timeout), the last outcomes written,
 * late hand-backs waited for, then the heartbeat ends.
 */
export async function stopEngine(
  parts: EngineParts,
  timeoutMs: number,
  alongside?: Promise<unknown>,
): Promise<StopResult> {
  const { fetcher, queue, handBack, dispatcher, held, completer, heartbeat, log, emitter } = parts;
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
    handBack.release(unstarted).then((n) => {
      released = n;
    }),
    writeGrace(),
  );

  let abandoned: string[] = [];
  const finished = await within(dispatcher.done(), left());
  if (!finished) {
    const rows = dispatcher.abandon(new Error("worker stop timeout"));
    for (const h of rows) held.delete(h);
    abandoned = rows.map((h) => h.row.id);
    log.warn({ abandoned }, "stop timeout: handlers aborted, their leases are left to expire");
    emitter.emit("drain_timeout", { abandoned });
  }
  const flushed = await within(completer.idle(), writeGrace());
  completer.stop();
  await within(
    handBack.lateReleased().then((late) => {
      released += late;
    }),
    writeGrace(),
  );
  await within(heartbeat.stop(), left());
  const drained = finished && flushed && completer.pending === 0;
  return { drained, released, abandoned };
}
