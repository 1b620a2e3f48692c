import { OutboxError } from "../contract/errors.js";

/**
 * The bounded buffer between the fetcher and the dispatch loops.
 *
 * Invariant: never more than `capacity` items are held, so memory does not grow with the backlog; the
 * fetcher asks the database for at most `free` rows and push() refuses anything beyond that. Outside
 * push(), waiters exist only while the queue is empty, and every item leaves exactly once: by take(),
 * remove() or drain().
 */
export class LocalQueue<T> {
  readonly #capacity: number;
  #items: T[] = [];
  readonly #waiters: ((item: T | undefined) => void)[] = [];
  #closed = false;

  /** Called synchronously, after the item is handed out, whenever an item leaves via take(). */
  onTake?: (sizeAfter: number) => void;

  constructor(capacity: number) {
    if (!Number.isInteger(capacity) || capacity < 1) {
      throw new RangeError(`capacity must be an integer >= 1, got ${String(capacity)}`);
    }
    this.#capacity = capacity;
  }

  get size(): number {
    return this.#items.length;
  }

  get capacity(): number {
    return this.#capacity;
  }

  get free(): number {
    return this.#capacity - this.#items.length;
  }

  get closed(): boolean {
    return this.#closed;
  }

  /** Adds all items or none: throws if closed or if they would not fit in `free`. */
  push(items: readonly T[]): void {
    if (this.#closed) throw new OutboxError("LocalQueue is closed");
    if (items.length > this.free) {
      throw new RangeError(`LocalQueue overflow: ${items.length} items pushed, ${this.free} free`);
    }
    // Not push(...items): spreading a large batch can exceed the engine's argument limit.
    for (const item of items) this.#items.push(item);
    this.#serveWaiters();
  }

  /** Resolves with the next item, or undefined once the queue is closed and empty. FIFO for waiters too. */
  take(): Promise<T | undefined> {
    // Pending waiters go first even if items are present (only possible when onTake re-enters).
    if (this.#waiters.length === 0 && this.#items.length > 0) {
      const item = this.#items.shift() as T;
      this.#notifyTake();
      return Promise.resolve(item);
    }
    if (this.#closed && this.#items.length === 0) return Promise.resolve(undefined);
    return new Promise((resolve) => {
      this.#waiters.push(resolve);
    });
  }

  /** The next item if one is queued and nobody waits for it: take() without a promise per item. */
  tryTake(): T | undefined {
    if (this.#waiters.length > 0 || this.#items.length === 0) return undefined;
    const item = this.#items.shift() as T;
    this.#notifyTake();
    return item;
  }

  /** Removes and returns everything queued; waiters keep waiting. */
  drain(): T[] {
    const items = this.#items;
    this.#items = [];
    return items;
  }

  /** Removes and returns the queued items matching `pred`; if `pred` throws, nothing is removed. */
  remove(pred: (item: T) => boolean): T[] {
    const kept: T[] = [];
    const removed: T[] = [];
    for (const item of this.#items) (pred(item) ? removed : kept).push(item);
    this.#items = kept;
    return removed;
  }

  /** Idempotent. Queued items can still be taken; once empty every take() resolves undefined. */
  close(): void {
    this.#closed = true;
    if (this.#items.length > 0) return;
    for (const resolve of this.#waiters.splice(0)) resolve(undefined);
  }

  #serveWaiters(): void {
    while (this.#waiters.length > 0 && this.#items.length > 0) {
      const resolve = this.#waiters.shift() as (item: T | undefined) => void;
      resolve(this.#items.shift() as T);
      this.#notifyTake();
    }
  }

  #notifyTake(): void {
    const hook = this.onTake;
    if (!hook) return;
    try {
      hook(this.#items.length);
    } catch (error) {
      // The item is already handed out; throwing here would lose it, so the bug is only reported.
      process.emitWarning(error instanceof Error ? error : String(error), {
        code: "OUTBOX_LOCAL_QUEUE_ONTAKE",
      });
    }
  }
}
