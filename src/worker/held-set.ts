import type { HeldRow } from "../lease/held.js";
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
