import type { LeasedRow } from "../sql/fetch.js";
import type { Delivery } from "./store.js";

/**
 * A held row's life: every state change of a delivery happens through the functions below, nowhere else.
 *
 *   from                          event                                              to          function
 *   –                             leased by a fetch                                  queued      heldRows
 *   queued                        a dispatch loop starts its handler                 running     startRunning
 *   queued, running               an outcome is decided (handler or no handler)      completing  startCompleting
 *   completing                    its ack / retry / dead-letter write landed         acked,      settle
 *                                                                                    retried, dead
 *   queued                        a graceful stop handed it back                     released    settle
 *   queued, running, completing   a write or a renewal found another token           lost        lose
 *   running                       the stop timeout aborted its handler               lost        lose
 *   acked … lost                  anything                                           (final: late events change nothing)
 *
 * `writing` is orthogonal: a completion statement for it is in flight, so the heartbeat leaves it alone
 * (a renewal racing a DELETE would report the row as lost).
 */
export type HeldState =
  | "queued"
  | "running"
  | "completing"
  | "acked"
  | "retried"
  | "dead"
  | "released"
  | "lost";

/** The final states a write that landed leaves a delivery in. */
export type SettledState = "acked" | "retried" | "dead" | "released";

const FINAL: ReadonlySet<HeldState> = new Set(["acked", "retried", "dead", "released", "lost"]);

/** A delivery this worker holds, from its fetch until its outcome lands (or the lease is lost). */
export interface HeldRow extends Delivery {
  readonly row: LeasedRow;
  readonly state: HeldState;
  writing: boolean;
  /** Created on first use of the handler's signal: most handlers never read it, and it costs per message. */
  controller: AbortController | undefined;
  startedAt: number;
  /**
   * Until when (performance.now(), a monotonic clock) the database has confirmed this delivery is still
   * ours: the send time of the last statement that leased or renewed it, plus the lease's life, less a
   * margin. A worker frozen past it (SIGSTOP, a VM pause, a long GC) must confirm before it starts the row:
   * another worker may have taken it meanwhile (see `mayStart`).
   */
  validUntil: number;
}

type Mutable = { -readonly [K in keyof HeldRow]: HeldRow[K] };

/** The deliveries of one lease, all queued, confirmed ours until `validUntil` (monotonic ms). */
export function heldRows(
  token: string,
  rows: readonly LeasedRow[],
  validUntil = Number.POSITIVE_INFINITY,
): HeldRow[] {
  return rows.map((row) => ({
    id: row.id,
    token,
    queue: row.queue,
    key: row.key,
    row,
    state: "queued",
    writing: false,
    controller: undefined,
    startedAt: 0,
    validUntil,
  }));
}

/** True while the delivery is still ours and unfinished. */
export function isLive(held: HeldRow): boolean {
  return !FINAL.has(held.state);
}

export function startRunning(held: HeldRow, at: number): boolean {
  if (held.state !== "queued") return false;
  (held as Mutable).state = "running";
  held.startedAt = at;
  return true;
}

/** The outcome is decided and goes to the completer; false if the lease was lost meanwhile (drop it). */
export function startCompleting(held: HeldRow): boolean {
  if (held.state !== "queued" && held.state !== "running") return false;
  (held as Mutable).state = "completing";
  return true;
}

/** Its outcome landed (from completing), or it was handed back (from queued): nothing more to do for it. */
export function settle(held: HeldRow, to: SettledState): void {
  const from = to === "released" ? "queued" : "completing";
  if (held.state === from) (held as Mutable).state = to;
}

/** Another worker owns the row now (or the stop gave up on it): abort its handler. False if already final. */
export function lose(held: HeldRow, reason: Error): boolean {
  if (!isLive(held)) return false;
  (held as Mutable).state = "lost";
  abortHeld(held, reason);
  return true;
}

/** Whether the database's last word on this delivery still vouches for it now (monotonic clock). */
export function confirmedNow(held: HeldRow): boolean {
  return performance.now() < held.validUntil;
}

/** The signal handed to the handler; created lazily. */
export function heldSignal(held: HeldRow): AbortSignal {
  held.controller ??= new AbortController();
  return held.controller.signal;
}

/** Abort the handler's signal, creating it if the handler has not read it yet (it may read it later). */
export function abortHeld(held: HeldRow, reason: Error): void {
  held.controller ??= new AbortController();
  held.controller.abort(reason);
}
