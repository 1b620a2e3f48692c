import type {
  AckWrite,
  DeadWrite,
  Delivery,
  Landed,
  Lease,
  LeaseStore,
  ReclaimedLease,
  RetryWrite,
  RowFate,
} from "../../src/lease/store.js";
import type { MemoryLeaseStore, MemoryTable } from "./memory-store.js";

export type StoreCall = "lease" | "ack" | "retry" | "deadLetter" | "release" | "renew" | "reclaim";

/** One delivery named by a write: its token, the row's token just before the write, and whether it landed. */
export interface WrittenDelivery {
  id: string;
  token: string;
  /** The row's token when the write ran (undefined: the row was gone). */
  rowToken: string | null | undefined;
  landed: boolean;
}

/** One call of the store, in the order the calls ran (`seq` is shared with whatever else the journal records). */
export interface StoreRecord {
  type: "store";
  seq: number;
  call: StoreCall;
  /** Thrown on purpose before reaching the table (a database error): nothing was written. */
  failed: boolean;
  deliveries: WrittenDelivery[];
  /** For `lease`: the token and each row's delivery count. */
  lease?: { token: string; rows: { id: string; deliveries: number }[] };
}

/** A worker event, recorded in the same order as the store calls. */
export interface EventRecord {
  type: "event";
  seq: number;
  name: string;
  payload: Record<string, unknown>;
}

/** A shared, ordered record of store calls and events. */
export class Journal {
  readonly entries: (StoreRecord | EventRecord)[] = [];
  #seq = 0;

  next(): number {
    return ++this.#seq;
  }

  push(entry: StoreRecord | EventRecord): void {
    this.entries.push(entry);
  }

  event(name: string, payload: object): void {
    this.entries.push({ type: "event", seq: this.next(), name, payload: { ...payload } });
  }

  get events(): EventRecord[] {
    return this.entries.filter((e): e is EventRecord => e.type === "event");
  }

  get records(): StoreRecord[] {
    return this.entries.filter((e): e is StoreRecord => e.type === "store");
  }
}

/**
 * A `MemoryLeaseStore` that records every call (which deliveries it named, what the row's token was at that
 * moment, what landed) and can fail the next calls of a kind on demand, like a database error that reaches
 * the worker before anything was written. The memory store applies a write synchronously when called, so
 * the token read just before the call is the one the write saw.
 */
export class RecordingStore implements LeaseStore {
  readonly #failures = new Map<StoreCall, number>();
  /** Every token this store's leases made. */
  readonly tokens = new Set<string>();

  constructor(
    readonly inner: MemoryLeaseStore,
    readonly table: MemoryTable,
    readonly journal: Journal,
  ) {}

  /** The next `times` calls of `call` throw without touching the table. */
  failNext(call: StoreCall, times = 1): void {
    this.#failures.set(call, (this.#failures.get(call) ?? 0) + times);
  }

  #injected(call: StoreCall, deliveries: readonly Delivery[]): boolean {
    const left = this.#failures.get(call) ?? 0;
    if (left <= 0) return false;
    this.#failures.set(call, left - 1);
    this.journal.push({
      type: "store",
      seq: this.journal.next(),
      call,
      failed: true,
      deliveries: deliveries.map((d) => ({ id: d.id, token: d.token, rowToken: undefined, landed: false })),
    });
    return true;
  }

  async lease(limit: number, maxBytes?: number): Promise<Lease> {
    if (this.#injected("lease", [])) throw new Error("injected database error (lease)");
    return this.#recordLease(await this.inner.lease(limit, maxBytes));
  }

  async leaseAlone(keep?: readonly string[]): Promise<Lease> {
    if (this.#injected("lease", [])) throw new Error("injected database error (lease)");
    return this.#recordLease(await this.inner.leaseAlone(keep));
  }

  suspectsWaiting(keep?: readonly string[]): Promise<boolean> {
    return this.inner.suspectsWaiting(keep);
  }

  #recordLease(lease: Lease): Lease {
    this.tokens.add(lease.token);
    this.journal.push({
      type: "store",
      seq: this.journal.next(),
      call: "lease",
      failed: false,
      deliveries: [],
      lease: {
        token: lease.token,
        rows: lease.rows.map((r) => ({ id: r.id, deliveries: r.deliveries_count })),
      },
    });
    return lease;
  }

  async #write(
    call: StoreCall,
    deliveries: readonly Delivery[],
    run: () => Promise<Landed>,
  ): Promise<Landed> {
    if (this.#injected(call, deliveries)) throw new Error(`injected database error (${call})`);
    const before = deliveries.map((d) => this.table.rows.get(d.id)?.token);
    // Applied synchronously by the memory store, at this call: `before` is what the write saw.
    const pending = run();
    const record: StoreRecord = {
      type: "store",
      seq: this.journal.next(),
      call,
      failed: false,
      deliveries: deliveries.map((d, i) => ({
        id: d.id,
        token: d.token,
        rowToken: before[i],
        landed: false,
      })),
    };
    this.journal.push(record);
    const landed = await pending;
    deliveries.forEach((d, i) => {
      (record.deliveries[i] as WrittenDelivery).landed = landed.has(d);
    });
    return landed;
  }

  ack(writes: readonly AckWrite[], handOff?: number): Promise<Landed> {
    return this.#handOff(
      this.#write(
        "ack",
        writes.map((w) => w.held),
        () => this.inner.ack(writes, handOff),
      ),
    );
  }

  /** Rows a write handed off are a lease like any other: recorded as one, right after the write. */
  async #handOff(write: Promise<Landed>): Promise<Landed> {
    const landed = await write;
    if (landed.handedOff !== undefined) this.#recordLease(landed.handedOff);
    return landed;
  }

  retry(writes: readonly RetryWrite[]): Promise<Landed> {
    return this.#write(
      "retry",
      writes.map((w) => w.held),
      () => this.inner.retry(writes),
    );
  }

  deadLetter(writes: readonly DeadWrite[], handOff?: number): Promise<Landed> {
    return this.#handOff(
      this.#write(
        "deadLetter",
        writes.map((w) => w.held),
        () => this.inner.deadLetter(writes, handOff),
      ),
    );
  }

  release(deliveries: readonly Delivery[]): Promise<Landed> {
    return this.#write("release", deliveries, () => this.inner.release(deliveries));
  }

  renew(deliveries: readonly Delivery[]): Promise<Landed> {
    return this.#write("renew", deliveries, () => this.inner.renew(deliveries));
  }

  /** A read: not journalled (it writes nothing). */
  whereabouts(deliveries: readonly Delivery[]): Promise<RowFate[]> {
    return this.inner.whereabouts(deliveries);
  }

  /** Journalled with the deliveries whose leases it cleared (`rowToken`: the token the row had). */
  async reclaim(tokens: readonly string[], held: readonly Delivery[]): Promise<ReclaimedLease[]> {
    // The memory store clears them when called: that is their place in the journal.
    const seq = this.journal.next();
    const cleared = await this.inner.reclaim(tokens, held);
    this.journal.push({
      type: "store",
      seq,
      call: "reclaim",
      failed: false,
      deliveries: cleared.map((d) => ({ id: d.id, token: d.token, rowToken: d.token, landed: true })),
    });
    return cleared;
  }
}
