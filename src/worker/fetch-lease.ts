import { type HeldRow, heldRows } from "../lease/held.js";
import type { LeaseStore } from "../lease/store.js";
import { type HeldSet, payloadBytes } from "./held-set.js";
import type { LoopHealth } from "./loop-health.js";
import type { Prefetch } from "./prefetch.js";

export interface FetchLeaseDeps {
  store: Pick<LeaseStore, "lease">;
  prefetch: Prefetch;
  held: HeldSet;
  health: LoopHealth;
  maxHeldBytes: number;
  /** How long after the lease statement was sent its rows count as confirmed ours. */
  confirmedForMs: number;
}

/** One fetch: lease up to `limit` rows within the byte budget left, and let the prefetch learn from it. */
export function fetchLease(deps: FetchLeaseDeps) {
  const { store, prefetch, held, health } = deps;
  return async (limit: number): Promise<{ rows: HeldRow[]; more?: boolean }> => {
    const started = performance.now();
    prefetch.reserve(limit);
    try {
      // The statement stops at the bytes left. It always takes one row, so a row larger than the budget
      // is still delivered: what is held can pass the budget by that one row.
      const lease = await store.lease(limit, Math.max(1, deps.maxHeldBytes - held.bytes));
      let bytes = 0;
      for (const row of lease.rows) bytes += payloadBytes(row);
      prefetch.fetched(lease.rows.length, bytes, performance.now() - started);
      health.recovered("fetch");
      // `started` is before the statement: the server's expiry is at least that plus the TTL.
      return { rows: heldRows(lease.token, lease.rows, started + deps.confirmedForMs), more: lease.more };
    } finally {
      prefetch.unreserve();
    }
  };
}
