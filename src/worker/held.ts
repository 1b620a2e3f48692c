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
  controller: AbortController | undefined;
  startedAt: number;
}
