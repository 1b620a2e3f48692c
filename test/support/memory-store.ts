import { randomUUID } from "node:crypto";
import type { PreparedFollowUp } from "../../src/contract/follow-up.js";
import { QueueShares } from "../../src/lease/queue-shares.js";
import {
  type AckWrite,
  allLanded,
  type DeadWrite,
  type Delivery,
  type Landed,
  type LeaseStore,
  type ReclaimedLease,
  type RetryWrite,
  type RowFate,
} from "../../src/lease/store.js";
import type { LeasedRow } from "../../src/sql/fetch.js";

/** A row of the in-memory `messages` table: what the fetch statement and the writes read and set. */
export interface MemoryRow {
  id: string;
  queue: string;
  payload: string;
  headers: Record<string, string>;
  key: string | null;
  /** Keyless, or no earlier row of its queue and key left: only heads are due on ordered queues. */
  head: boolean;
  createdAt: number;
  availableAt: number;
  token: string | null;
  leaseExpiresAt: number | null;
  acquiredBy: string | null;
  deliveries: number;
  attempts: number;
  failures: number;
  firstAttemptAt: number | null;
  lastAttemptAt: number | null;
  lastError: string | null;
}

export interface MemoryDeadLetter {
  row: MemoryRow;
  reason: string;
  error: string | null;
}

export interface MemoryLeaseStoreOptions {
  queues: readonly string[];
  /** Queues (among `queues`) whose keys are plain metadata: no per-key ordering. */
  unorderedQueues?: readonly string[];
  workerId?: string;
  leaseTtlMs: number;
  maxErrorLength?: number;
  /** The server clock, in ms; tests move it to expire leases and bring retries due. */
  now?: () => number;
}

/**
 * The lease store's contract in memory, for fast and deterministic tests of the fetcher, completer,
 * heartbeat and dispatcher, and for model tests of the whole loop. It mirrors the Postgres store's
 * semantics (the same conformance suite runs against both): due rows oldest first, expired leases taken
 * over under a new token, every write applied only to rows that still carry the delivery's token.
 * Several stores may share one `MemoryTable`, like workers sharing a database.
 */
export class MemoryTable {
  readonly rows = new Map<string, MemoryRow>();
  readonly deadLetters = new Map<string, MemoryDeadLetter>();
  #nextId = 1;

  constructor(readonly now: () => number = Date.now) {}

  insert(
    queue: string,
    payload: unknown = {},
    options: { delayMs?: number; key?: string | null } = {},
  ): string {
    const id = String(this.#nextId++);
    const at = this.now();
    const key = options.key ?? null;
    this.rows.set(id, {
      id,
      queue,
      payload: JSON.stringify(payload),
      headers: {},
      key,
      head: key === null || this.#oldestOfKey(queue, key) === undefined,
      createdAt: at,
      availableAt: at + (options.delayMs ?? 0),
      token: null,
      leaseExpiresAt: null,
      acquiredBy: null,
      deliveries: 0,
      attempts: 0,
      failures: 0,
      firstAttemptAt: null,
      lastAttemptAt: null,
      lastError: null,
    });
    return id;
  }

  #oldestOfKey(queue: string, key: string): MemoryRow | undefined {
    let oldest: MemoryRow | undefined;
    for (const r of this.rows.values()) {
      if (r.queue === queue && r.key === key && (oldest === undefined || Number(r.id) < Number(oldest.id))) {
        oldest = r;
      }
    }
    return oldest;
  }

  /** A row left messages: when it headed its key, the oldest row left of that key heads it now (returned). */
  remove(row: MemoryRow): MemoryRow | undefined {
    this.rows.delete(row.id);
    if (row.key === null || !row.head) return undefined;
    const next = this.#oldestOfKey(row.queue, row.key);
    if (next !== undefined) next.head = true;
    return next;
  }
}

export class MemoryLeaseStore implements LeaseStore {
  readonly #table: MemoryTable;
  readonly #options: Required<Omit<MemoryLeaseStoreOptions, "now">>;
  readonly #shares: QueueShares;
  /** Every token this store made, in order: a test can tell a stale write from a current one. */
  readonly tokens: string[] = [];

  constructor(table: MemoryTable, options: MemoryLeaseStoreOptions) {
    this.#table = table;
    this.#options = { workerId: "memory", maxErrorLength: 4000, unorderedQueues: [], ...options };
    this.#shares = new QueueShares(this.#options.queues);
  }

  #owned(d: Delivery): MemoryRow | undefined {
    const row = this.#table.rows.get(d.id);
    return row !== undefined && row.token === d.token ? row : undefined;
  }

  /** As aloneStatement: the oldest row of the store's queues whose lease ran out, not under a kept token. */
  #suspects(keep: readonly string[]): MemoryRow[] {
    const now = this.#table.now();
    const kept = new Set(keep);
    const unordered = new Set(this.#options.unorderedQueues);
    return [...this.#table.rows.values()]
      .filter(
        (r) =>
          this.#options.queues.includes(r.queue) &&
          r.token !== null &&
          r.availableAt <= now &&
          (r.head || unordered.has(r.queue)) &&
          (r.leaseExpiresAt ?? 0) <= now &&
          !kept.has(r.token),
      )
      .sort((a, b) => a.availableAt - b.availableAt || Number(a.id) - Number(b.id));
  }

  async leaseAlone(keep: readonly string[] = []) {
    const token = randomUUID();
    this.tokens.push(token);
    const [row] = this.#suspects(keep);
    return { token, rows: row ? [this.#take(row, token, this.#table.now())] : [] };
  }

  async suspectsWaiting(keep: readonly string[] = []) {
    return this.#suspects(keep).length > 0;
  }

  async lease(limit: number, maxBytes = Number.POSITIVE_INFINITY) {
    const now = this.#table.now();
    const token = randomUUID();
    this.tokens.push(token);
    const unordered = new Set(this.#options.unorderedQueues);
    const oldest = (a: MemoryRow, b: MemoryRow) =>
      a.availableAt - b.availableAt || Number(a.id) - Number(b.id);
    const split = this.#shares.split(limit);
    // As the fetch statement: each queue's oldest rows up to its share, its k-th row at turn k / share.
    const due = this.#options.queues
      .flatMap((queue, i) => {
        const share = split[i] ?? limit;
        return [...this.#table.rows.values()]
          .filter(
            (r) =>
              r.queue === queue &&
              r.token === null &&
              r.availableAt <= now &&
              (r.head || unordered.has(r.queue)),
          )
          .sort(oldest)
          .slice(0, share)
          .map((row, k) => ({ row, turn: (k + 1) / share }));
      })
      .sort((a, b) => a.turn - b.turn || oldest(a.row, b.row))
      .slice(0, limit)
      .map((c) => c.row);
    // As the fetch statement: a running sum of payload sizes, the first row always taken.
    let bytes = 0;
    let taken = 0;
    for (const r of due) {
      bytes += r.payload.length;
      if (taken > 0 && bytes > maxBytes) break;
      taken++;
    }
    due.length = taken;
    const counts = new Map<string, number>();
    for (const r of due) counts.set(r.queue, (counts.get(r.queue) ?? 0) + 1);
    const more = this.#shares.record(limit, split, counts);
    return { token, rows: due.map((r) => this.#take(r, token, now)), more };
  }

  /** Lease one row under `token`: what the fetch statement sets and returns. */
  #take(r: MemoryRow, token: string, now: number): LeasedRow {
    r.token = token;
    r.leaseExpiresAt = now + this.#options.leaseTtlMs;
    r.acquiredBy = this.#options.workerId;
    r.deliveries++;
    return {
      id: r.id,
      queue: r.queue,
      payload: r.payload,
      headers: r.headers,
      key: r.key,
      created_epoch: r.createdAt / 1000,
      deliveries_count: r.deliveries,
      attempts_count: r.attempts,
      failures_count: r.failures,
      first_attempt_at: r.firstAttemptAt === null ? null : new Date(r.firstAttemptAt),
      last_attempt_at: r.lastAttemptAt === null ? null : new Date(r.lastAttemptAt),
    };
  }

  /** Up to `limit` of the new heads that are due and unleased, leased to the caller (the hand-off). */
  #handOff(landed: Landed, promoted: MemoryRow[], limit: number): Landed {
    const now = this.#table.now();
    const due = promoted
      .filter((r) => this.#table.rows.get(r.id) === r && r.token === null && r.availableAt <= now)
      .sort((a, b) => Number(a.id) - Number(b.id))
      .slice(0, Math.max(0, limit));
    if (due.length === 0) return landed;
    const token = randomUUID();
    this.tokens.push(token);
    return { ...landed, handedOff: { token, rows: due.map((r) => this.#take(r, token, now)) } };
  }

  #write<D>(
    items: readonly D[],
    delivery: (d: D) => Delivery,
    apply: (row: MemoryRow, item: D) => void,
  ): Landed {
    const landed = new Set<string>();
    for (const item of items) {
      const d = delivery(item);
      const row = this.#owned(d);
      if (row === undefined) continue;
      apply(row, item);
      landed.add(`${d.id}/${d.token}`);
    }
    return landed.size === items.length
      ? allLanded(items.length)
      : { has: (d) => landed.has(`${d.id}/${d.token}`), count: landed.size };
  }

  #clearLease(row: MemoryRow): void {
    row.token = null;
    row.leaseExpiresAt = null;
    row.acquiredBy = null;
  }

  async ack(writes: readonly AckWrite[], handOff = 0) {
    const promoted: MemoryRow[] = [];
    const landed = this.#write(
      writes,
      (w) => w.held,
      (row, w) => {
        const next = this.#table.remove(row);
        if (next) promoted.push(next);
        // Only a delete under the delivery's token gets here: a lost lease inserts no follow-up.
        for (const f of w.followUps ?? []) this.#insertFollowUp(f);
      },
    );
    return this.#handOff(landed, promoted, handOff);
  }

  /** After its parent left (as in Postgres, where the insert follows the ack in its transaction). */
  #insertFollowUp(f: PreparedFollowUp): void {
    const now = this.#table.now();
    const id = this.#table.insert(f.queue, JSON.parse(f.payloadText), { key: f.key });
    const row = this.#table.rows.get(id) as MemoryRow;
    row.payload = f.payloadText;
    row.headers = { ...f.headers };
    row.availableAt = f.availableAt?.getTime() ?? now + (f.delayMs ?? 0);
  }

  async retry(writes: readonly RetryWrite[]) {
    const now = this.#table.now();
    return this.#write(
      writes,
      (w) => w.held,
      (row, w) => {
        this.#clearLease(row);
        row.availableAt = now + w.delayMs;
        row.attempts++;
        row.failures += w.failed;
        row.firstAttemptAt ??= now;
        row.lastAttemptAt = now;
        row.lastError = w.error.slice(0, this.#options.maxErrorLength);
      },
    );
  }

  async deadLetter(writes: readonly DeadWrite[], handOff = 0) {
    const now = this.#table.now();
    const promoted: MemoryRow[] = [];
    const landed = this.#write(
      writes,
      (w) => w.held,
      (row, w) => {
        const next = this.#table.remove(row);
        if (next) promoted.push(next);
        row.attempts += w.attempted;
        row.failures += w.failed;
        if (w.attempted > 0) {
          row.firstAttemptAt ??= now;
          row.lastAttemptAt = now;
        }
        const error = (w.error ?? row.lastError)?.slice(0, this.#options.maxErrorLength) ?? null;
        this.#table.deadLetters.set(row.id, { row, reason: w.reason, error });
      },
    );
    return this.#handOff(landed, promoted, handOff);
  }

  async release(deliveries: readonly Delivery[]) {
    return this.#write(
      deliveries,
      (d) => d,
      (row) => {
        this.#clearLease(row);
        row.deliveries = Math.max(row.deliveries - 1, 0);
      },
    );
  }

  async whereabouts(deliveries: readonly Delivery[]): Promise<RowFate[]> {
    return deliveries.map((d) => {
      const row = this.#table.rows.get(d.id);
      if (row === undefined) return this.#table.deadLetters.has(d.id) ? "dead" : "gone";
      if (row.token === null) return "unleased";
      return row.token === d.token ? "held" : "taken";
    });
  }

  async renew(deliveries: readonly Delivery[]) {
    const now = this.#table.now();
    return this.#write(
      deliveries,
      (d) => d,
      (row) => {
        row.leaseExpiresAt = now + this.#options.leaseTtlMs;
      },
    );
  }

  async reclaim(tokens: readonly string[], held: readonly Delivery[]): Promise<ReclaimedLease[]> {
    const own = new Set(tokens);
    const kept = new Set(held.map((d) => `${d.id}/${d.token}`));
    const cleared: ReclaimedLease[] = [];
    for (const row of this.#table.rows.values()) {
      if (!this.#options.queues.includes(row.queue) || row.token === null || !own.has(row.token)) continue;
      if (kept.has(`${row.id}/${row.token}`)) continue;
      cleared.push({ id: row.id, token: row.token, queue: row.queue });
      // Not `release`: deliveries stay counted.
      this.#clearLease(row);
    }
    return cleared;
  }
}
