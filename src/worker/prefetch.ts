import { RowSize } from "./row-size.js";

/**
 * A fetch's round trip counts for the prefetch estimate as if it had carried at most this many payload
 * bytes. Beyond that its time grows with its bytes (Postgres turns about 30 MB/s of jsonb into text): rows
 * kept locally cannot hide that, and counting it would make the next fetch bigger, and slower, still.
 */
const FETCH_TIME_BYTES = 2 ** 20;

export interface PrefetchOptions {
  /** Bound of the local queue, plus completions pending and the fetch in flight. */
  capacity: number;
  concurrency: number;
  maxHeldBytes: number;
}

/** What the worker holds right now, as the prefetch sees it. */
export interface HeldNow {
  /** Rows in the local queue. */
  queued: number;
  /** Outcomes submitted, not written yet. */
  completing: number;
  /** Every delivery held: queued, running, completing. */
  held: number;
  /** Their payload bytes. */
  heldBytes: number;
  /** Handler run time, moving average (ms); undefined until a handler finished. */
  handlerMs: number | undefined;
}

/**
 * How many rows the next fetch may ask for: room in the local queue, but no more rows than the dispatch
 * loops can start before the next fetch would land, and no more than fit in the byte budget left. Learns
 * the fetch's round trip and the rows' size from each fetch.
 */
export class Prefetch {
  readonly #options: PrefetchOptions;
  // Round trip of the last leases (moving average, ms, each counted up to FETCH_TIME_BYTES): how long a row
  // takes to arrive once asked for.
  #fetchMs = 1;
  // A fetch asks for no more rows of the recent size than fit in the byte budget left, whatever the
  // statement's cut counted (a compressed payload's stored size is far below its text).
  readonly #rowSize = new RowSize();
  // Room promised to the fetch in flight: not free for the next.
  #reserved = 0;

  constructor(options: PrefetchOptions) {
    this.#options = options;
  }

  /**
   * Free slots for the next fetch. With slow handlers a worker must not hoard rows that another, idle
   * worker could run now: rows wait locally only as long as it takes to fetch more.
   */
  free(now: HeldNow): number {
    const { capacity, concurrency } = this.#options;
    const room = capacity - now.queued - now.completing - this.#reserved;
    // Until a handler finished, one loop's worth ahead: a first fetch must not hoard rows for handlers
    // that may take seconds.
    const soon =
      now.handlerMs === undefined
        ? concurrency
        : Math.ceil((concurrency * (2 * this.#fetchMs + 1)) / Math.max(now.handlerMs, 0.001));
    // Counted over every held row not yet completing: queued, handed to a loop but not started, running.
    const active = now.held - now.completing;
    return Math.min(room, Math.max(0, concurrency + soon - active), this.#rowsInBudget(now));
  }

  /** A fetch of up to `limit` rows is in flight: its room is not free for the next until it ends. */
  reserve(limit: number): void {
    this.#reserved = limit;
  }

  /** The fetch in flight ended (its rows, if any, are counted as held now). */
  unreserve(): void {
    this.#reserved = 0;
  }

  /** A fetch brought `bytes` in `rows` rows: learn the row size (up at once, down slowly) and the round trip. */
  fetched(rows: number, bytes: number, ms: number): void {
    this.#rowSize.learn(rows, bytes);
    this.#fetchMs = this.#fetchMs * 0.8 + ms * Math.min(1, FETCH_TIME_BYTES / Math.max(1, bytes)) * 0.2;
  }

  /** Rows of the recent size that fit in the byte budget left; at least one while nothing is held. */
  #rowsInBudget(now: HeldNow): number {
    const left = this.#options.maxHeldBytes - now.heldBytes;
    const fit = this.#rowSize.rowsIn(left);
    // Size unknown yet: the statement's cut alone.
    if (fit === undefined) return left > 0 ? this.#options.capacity : 0;
    return now.held === 0 ? Math.max(1, fit) : fit;
  }
}
