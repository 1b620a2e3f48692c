import { TransientError } from "../contract/handler-errors.js";
import { withDeadline } from "./deadline.js";

export interface LazyConnectionOptions<C extends object> {
  /** One connection attempt, setup included; it must not retry on its own. */
  open: () => Promise<C>;
  dispose: (connection: C) => Promise<void>;
  /** Bounds each attempt and each dispose. */
  timeoutMs: number;
  /** After a failed attempt, calls fail at once with its error for this long instead of reconnecting. */
  retryDelayMs: number;
  /** Names the target in errors, e.g. the redacted URL. */
  what: string;
}

/**
 * A connection opened on first use and re-opened on the first use after it was dropped. Callers share
 * one attempt at a time; while the broker is down they get a TransientError instead of waiting.
 */
export class LazyConnection<C extends object> {
  readonly #options: LazyConnectionOptions<C>;
  #current: C | undefined;
  #pending: Promise<C> | undefined;
  #failure: { error: TransientError; at: number } | undefined;
  #closed = false;
  // An attempt can resolve with a connection whose close event already fired; it must not become current.
  readonly #dead = new WeakSet<C>();

  constructor(options: LazyConnectionOptions<C>) {
    this.#options = options;
  }

  get(): Promise<C> {
    const { what, retryDelayMs } = this.#options;
    if (this.#closed) return Promise.reject(new TransientError(`${what}: relay is closed`));
    if (this.#current !== undefined) return Promise.resolve(this.#current);
    if (this.#pending !== undefined) return this.#pending;
    if (this.#failure !== undefined && Date.now() - this.#failure.at < retryDelayMs) {
      return Promise.reject(this.#failure.error);
    }
    const pending = this.#attempt();
    this.#pending = pending;
    const clear = () => {
      if (this.#pending === pending) this.#pending = undefined;
    };
    pending.then(clear, clear);
    return pending;
  }

  /** Drop a connection that closed or failed; the next `get()` opens a new one. */
  invalidate(connection: C): void {
    if (this.#dead.has(connection)) return;
    this.#dead.add(connection);
    if (this.#current === connection) this.#current = undefined;
    void this.#dispose(connection);
  }

  /** Idempotent, and bounded by twice `timeoutMs`. */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    const current = this.#current;
    this.#current = undefined;
    const pending = this.#pending;
    await Promise.all([
      current === undefined ? undefined : this.#dispose(current),
      // An attempt in flight disposes its own connection once it sees the relay closed.
      pending === undefined
        ? undefined
        : withDeadline(pending, { timeoutMs: this.#options.timeoutMs * 2, what: "close" }).catch(() => {}),
    ]);
  }

  async #attempt(): Promise<C> {
    const { open, timeoutMs, what } = this.#options;
    const opening = Promise.resolve().then(open);
    let connection: C;
    try {
      connection = await withDeadline(opening, { timeoutMs, what: `${what}: connect` });
    } catch (error) {
      // A connection that arrives after the deadline is nobody's: close it rather than leak it.
      opening.then(
        (late) => this.#dispose(late),
        () => {},
      );
      const failure =
        error instanceof TransientError
          ? error
          : new TransientError(`${what}: cannot connect`, { cause: error });
      this.#failure = { error: failure, at: Date.now() };
      throw failure;
    }
    if (this.#closed || this.#dead.has(connection)) {
      await this.#dispose(connection);
      throw new TransientError(
        `${what}: ${this.#closed ? "relay is closed" : "connection closed during setup"}`,
      );
    }
    this.#current = connection;
    this.#failure = undefined;
    return connection;
  }

  async #dispose(connection: C): Promise<void> {
    const { dispose, timeoutMs, what } = this.#options;
    await withDeadline(Promise.resolve(connection).then(dispose), {
      timeoutMs,
      what: `${what}: close`,
    }).catch(() => {});
  }
}
