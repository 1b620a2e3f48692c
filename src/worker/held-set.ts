import { type HeldRow, isLive } from "../lease/held.js";
import type { LeasedRow } from "../sql/fetch.js";

/**
 * A row's weight in the byte budget (`maxHeldBytes`): its payload text's length. For ASCII JSON that is
 * its bytes, on the wire and in V8 (one byte a character); read without a scan of the text.
 */
export function payloadBytes(row: LeasedRow): number {
  return row.payload.length;
}

/**
 * The deliveries a worker holds (queued, running, completing) and the sum of their payload bytes, kept in
 * step: every delivery counts from its lease until it leaves, however it leaves.
 */
export class HeldSet implements Iterable<HeldRow> {
  readonly #rows = new Set<HeldRow>();
  #bytes = 0;

  get size(): number {
    return this.#rows.size;
  }

  get bytes(): number {
    return this.#bytes;
  }

  add(h: HeldRow): void {
    if (this.#rows.has(h)) return;
    this.#rows.add(h);
    this.#bytes += payloadBytes(h.row);
  }

  delete(h: HeldRow): boolean {
    if (!this.#rows.delete(h)) return false;
    this.#bytes -= payloadBytes(h.row);
    return true;
  }

  [Symbol.iterator](): Iterator<HeldRow> {
    return this.#rows.values();
  }
}

/**
 * The tokens of the deliveries a worker still holds. A handler that blocked the event loop past its lease is
 * still the worker's: the fetch must not lease its row again and start it twice (the heartbeat renews it once
 * the loop is free). A few tokens at most: one per fetch still being worked through.
 */
export function liveTokens(held: Iterable<HeldRow>): string[] {
  const tokens = new Set<string>();
  for (const h of held) if (isLive(h)) tokens.add(h.token);
  return [...tokens];
}

/**
 * The held deliveries whose leases the heartbeat renews: live ones not being written. While outcome writes
 * fail (`stalled`), their rows are not renewed: a lease kept alive for an outcome that cannot be written
 * would lock the row to this worker for as long as the writes keep failing.
 */
export function renewable(held: Iterable<HeldRow>, stalled: boolean): HeldRow[] {
  const rows: HeldRow[] = [];
  for (const h of held) {
    if (h.writing || !isLive(h)) continue;
    if (stalled && h.state === "completing") continue;
    rows.push(h);
  }
  return rows;
}
