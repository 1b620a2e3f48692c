import type pg from "pg";
import type { PreparedFollowUp } from "../contract/follow-up.js";
import type { LeasedRow } from "../sql/fetch.js";

/**
 * One lease of one row: its id and the token it was leased under. Every write names deliveries, not rows:
 * after its own lease ran out, a worker can hold the same row twice (the old delivery still running, the
 * new one leased again), and a write for the old one must never count for the new one.
 */
export interface Delivery {
  readonly id: string;
  readonly token: string;
  /**
   * The row's ordering key, when known: null says keyless, so an ack or dead-letter move has no key head to
   * hand on. Unknown (undefined) is treated as keyed.
   */
  readonly key?: string | null;
  /** The row's queue, when known (a keyed ack tries the key's lock from it without reading the row). */
  readonly queue?: string;
}

/** What one `lease` call took: every row carries the same, freshly made token. */
export interface Lease {
  readonly token: string;
  readonly rows: readonly LeasedRow[];
  /**
   * More rows are probably waiting although fewer than the limit came (a queue filled its share of the
   * fetch): fetch again now. A fetch that returned its limit says so by its length alone.
   */
  readonly more?: boolean;
}

/**
 * An acknowledged delivery: the row is deleted, and its follow-ups are inserted in the same transaction
 * only if that delete matched the token (a lost lease inserts nothing; a crash before commit neither).
 */
export interface AckWrite {
  readonly held: Delivery;
  readonly followUps?: readonly PreparedFollowUp[];
}

/** A failed attempt: the lease is cleared and the row is due again after `delayMs` (server clock). */
export interface RetryWrite {
  readonly held: Delivery;
  readonly delayMs: number;
  readonly error: string;
  /** 1 when the failure counts towards `maxAttempts` (transient ones do not). */
  readonly failed: 0 | 1;
}

/** A delivery that goes to the dead letters, with its reason; the move is one statement. */
export interface DeadWrite {
  readonly held: Delivery;
  readonly reason: string;
  /** Null keeps the row's last error. */
  readonly error: string | null;
  /** 1 when a handler ran for this delivery. */
  readonly attempted: 0 | 1;
  readonly failed: 0 | 1;
}

/** The deliveries a write touched. Any other one it was given had lost its lease: someone else owns the row now. */
export interface Landed {
  has(delivery: Delivery): boolean;
  readonly count: number;
  /**
   * Rows leased to the caller by this write (a hand-off): the next message of each key whose head it
   * removed, when due, up to the `handOff` limit the caller gave. The caller now holds them.
   */
  readonly handedOff?: Lease;
  /**
   * The deliveries written nothing for because a producer of their key has not committed yet (the key's
   * lock is busy): still held under their token, neither landed nor lost. Write them again shortly.
   */
  busy?(delivery: Delivery): boolean;
}

/**
 * The lease store owns the lease token's whole path: it makes each token, leases rows under it, and guards
 * every later write by it, so a worker whose lease was taken over writes nothing (the newer owner wins).
 * The fetcher, completer and heartbeat talk to it and never to SQL. `createPgLeaseStore` is the real one;
 * `MemoryLeaseStore` (test/support/memory-store.ts, not shipped) follows the same contract in memory for
 * fast, deterministic tests (one conformance suite runs against both).
 */
export interface LeaseStore {
  /**
   * Lease up to `limit` due, unleased rows of the worker's queues, oldest first, stopping before their
   * payloads sum past `maxBytes` (the first row is always taken: one larger than the budget is still
   * delivered). Postgres counts a payload's stored size, the memory store its text length. A row whose lease
   * ran out is never taken here: see `leaseAlone`.
   */
  lease(limit: number, maxBytes?: number): Promise<Lease>;
  /**
   * Lease the oldest row whose lease ran out (held by a delivery that ended without an outcome: a crash, a
   * freeze, a lost lease), alone: the caller runs it with nothing else held, so a crash loop's culprit alone
   * is charged its deliveries. No row when none waits. An expired lease under one of the `keep` tokens is
   * not taken: the caller still runs that delivery (its event loop was blocked past the lease), and renews
   * it rather than start it a second time.
   */
  leaseAlone(keep?: readonly string[]): Promise<Lease>;
  /** Whether a row `leaseAlone` would take is waiting (reads only). */
  suspectsWaiting(keep?: readonly string[]): Promise<boolean>;
  /**
   * Delete the rows. Removing a key's head makes the key's oldest row left its head; up to `handOff` of
   * those that are due are leased to the caller at once (`Landed.handedOff`), saving a fetch each.
   */
  ack(writes: readonly AckWrite[], handOff?: number): Promise<Landed>;
  retry(writes: readonly RetryWrite[]): Promise<Landed>;
  /** Move the rows to the dead letters; the key's next row is promoted (and handed off) as for `ack`. */
  deadLetter(writes: readonly DeadWrite[], handOff?: number): Promise<Landed>;
  /** Hand unstarted rows back without counting their delivery (a graceful stop). */
  release(deliveries: readonly Delivery[]): Promise<Landed>;
  /** Extend the leases by the lease TTL from now. */
  renew(deliveries: readonly Delivery[]): Promise<Landed>;
  /** Where each delivery's row is now, in input order; reads only (no lock, no lease). */
  whereabouts(deliveries: readonly Delivery[]): Promise<RowFate[]>;
  /**
   * Clear the leases under `tokens` (leases this process took) of rows for which no delivery in `held`
   * is held: a server crash undid their outcome writes, and nothing will write for them again. The rows are
   * due at once; unlike `release`, the delivery that ended stays counted (it ended without an outcome).
   */
  reclaim(tokens: readonly string[], held: readonly Delivery[]): Promise<ReclaimedLease[]>;
  /**
   * Open a transaction on a connection of its own, for a handler that commits with its ack (a queue with
   * `transaction: true`). Absent from stores without a database (the memory store).
   */
  begin?(): Promise<LeaseTransaction>;
}

/**
 * What one try of the ack inside a {@link LeaseTransaction} found: `acked` (the row deleted under this
 * token, its follow-ups inserted), `lost` (another token on the row: roll back), or `busy` (a producer of
 * its key, or of a follow-up's key, has not committed: nothing of this try was kept; try again shortly).
 */
export type TransactionAck = "acked" | "lost" | "busy";

/**
 * One open transaction on its own pooled connection (READ COMMITTED, so each statement of the keyed ack
 * sees what producers of the key committed). The handler writes through `client`; `ack` then runs the same
 * token-fenced ack statements as the batched acks, on this connection; `commit` or `rollback` ends it and
 * gives the connection back. Every method but `rollback` may throw; the caller then rolls back.
 */
export interface LeaseTransaction {
  readonly client: pg.PoolClient;
  /** The ack of this one delivery with its follow-ups, in this transaction (no hand-off). */
  ack(write: AckWrite): Promise<TransactionAck>;
  /** COMMIT, then the connection goes back to the pool (destroyed when the COMMIT failed). */
  commit(): Promise<void>;
  /**
   * ROLLBACK and give the connection back; with `destroy`, the connection is closed instead (it may be busy
   * with a query of a handler that timed out: a dirty connection never goes back to the pool). Never throws.
   */
  rollback(destroy?: Error): Promise<void>;
}

/** A delivery whose stale lease `reclaim` cleared, with its row's queue. */
export interface ReclaimedLease {
  readonly id: string;
  readonly token: string;
  readonly queue: string;
}

/**
 * Where a delivery's row is now, read after a write whose answer was lost (the statement may or may not have
 * committed): `held` still under this delivery's token, `unleased`, `taken` (under another token), `dead`
 * (in the dead letters) or `gone` (deleted: acknowledged).
 */
export type RowFate = "held" | "unleased" | "taken" | "dead" | "gone";

/** Every delivery of the write landed. */
export function allLanded(count: number): Landed {
  return { has: () => true, count };
}

/** The deliveries named by `key` among those a write returned. */
export function landedByKey(keys: ReadonlySet<string>, key: (d: Delivery) => string): Landed {
  return { has: (d) => keys.has(key(d)), count: keys.size };
}

/** An error of a write that still handed rows off (in an earlier transaction of the same call). */
export interface HandOffError extends Error {
  readonly handedOff: Lease;
}

/** `error`, carrying the rows the failed write handed off all the same. */
export function withHandOff(error: unknown, handedOff: Lease): HandOffError {
  const e = error instanceof Error ? error : new Error(String(error));
  return Object.assign(e, { handedOff });
}

/** A write refused because the worker's role may not insert follow-ups (no `--worker-can-follow-up`). */
export function followUpsRefused(error: unknown): boolean {
  return error instanceof Error && (error as { followUpsRefused?: unknown }).followUpsRefused === true;
}

/** The rows a failed write handed off, if any. */
export function handedOffBy(error: unknown): Lease | undefined {
  return error instanceof Error && "handedOff" in error ? (error as HandOffError).handedOff : undefined;
}
