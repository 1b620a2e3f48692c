import type { LeasedRow } from "../sql/fetch.js";

/**
 * A row this worker holds a lease on, from fetch until its outcome lands (or the lease is lost).
 * `writing` marks a completion statement in flight: the heartbeat leaves such rows alone, because a
 * renewal racing a DELETE would report the row as lost.
 */
export interface HeldRow {
  row: LeasedRow;
  token: string;
  state: "queued" | "running" | "completing" | "done" | "lost";
  writing: boolean;
  /** Created on first use of the handler's signal: most handlers never read it, and it costs per message. */
  controller: AbortController | undefined;
  startedAt: number;
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
