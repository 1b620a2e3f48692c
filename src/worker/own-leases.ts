import type { Logger } from "pino";
import type { Delivery, LeaseStore } from "../lease/store.js";
import type { WorkerEmitter } from "./events.js";

export interface OwnLeasesDeps {
  store: Pick<LeaseStore, "reclaim">;
  /** Every delivery the worker holds right now (queued, running, completing). */
  held(): Iterable<Delivery>;
  /**
   * How long after the last lease write under a token (its lease, a hand-off, a renewal) a lease under it
   * may still be live: the lease TTL, plus a round trip for the write to commit.
   */
  keepMs: number;
  log: Logger;
  emitter: WorkerEmitter;
  /** Rows were made due: fetch now. */
  wake(): void;
  now?: () => number;
}

/**
 * The leases this process took, known by their tokens: random UUIDs the lease store made for it, one per
 * lease, so unlike `acquired_by` (the host name by default, shared by every process on the host) a token
 * names this process alone. A server crash can undo its last outcome writes (`synchronous_commit = off`):
 * rows it acknowledged come back under a lease of its own that no delivery it holds carries, and nothing
 * would write for them until the lease runs out. `reclaim` clears those leases at once.
 */
export class OwnLeases {
  /** Token → when a lease write under it was last sent. */
  readonly #tokens = new Map<string, number>();
  readonly #now: () => number;
  #prunedAt: number;

  constructor(private readonly deps: OwnLeasesDeps) {
    this.#now = deps.now ?? (() => performance.now());
    this.#prunedAt = this.#now();
  }

  /**
   * Leases under these deliveries' tokens were written just now: call it where their rows join the held
   * set (so a token is never listed before its rows are held) and where their renewal is sent.
   */
  wrote(deliveries: Iterable<Delivery>): void {
    const now = this.#now();
    let last: string | undefined;
    for (const d of deliveries) {
      if (d.token === last) continue;
      last = d.token;
      this.#tokens.set(d.token, now);
    }
    // Memory stays bounded by the leases of about two TTLs; a sweep per TTL is cheap.
    if (now - this.#prunedAt >= this.deps.keepMs) this.#prune(now);
  }

  /** The tokens under which a lease of this process may still be live. */
  tokens(): string[] {
    this.#prune(this.#now());
    return [...this.#tokens.keys()];
  }

  #prune(now: number): void {
    this.#prunedAt = now;
    for (const [token, at] of this.#tokens) if (now - at > this.deps.keepMs) this.#tokens.delete(token);
  }

  /**
   * Clear the leases under this process's tokens of rows it holds no delivery for; those rows are due at
   * once. Harmless when nothing was lost: it then finds no row. Resolves with how many it took back.
   */
  async reclaim(): Promise<number> {
    // The tokens and the held deliveries in one synchronous snapshot: a row joins the held set in the same
    // tick as its token is noted, so no row just leased can look stale.
    const tokens = this.tokens();
    if (tokens.length === 0) return 0;
    const held = [...this.deps.held()];
    const rows = await this.deps.store.reclaim(tokens, held);
    if (rows.length === 0) return 0;
    const queues: Record<string, number> = {};
    for (const r of rows) queues[r.queue] = (queues[r.queue] ?? 0) + 1;
    this.deps.log.info(
      { rows: rows.length, queues },
      "took back rows left under this worker's own leases that it no longer holds (a database crash undid their outcome writes): due again now, not after the lease TTL",
    );
    this.deps.emitter.emit("reclaimed", { count: rows.length, queues });
    this.deps.wake();
    return rows.length;
  }
}
