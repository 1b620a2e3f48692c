import { describe, expect, it } from "vitest";
import { Completer, type CompleterDeps, type Outcome } from "../../src/complete/completer.js";
import { Heartbeat } from "../../src/complete/heartbeat.js";
import { type HeldRow, heldRows, startCompleting } from "../../src/lease/held.js";
import { MemoryLeaseStore, MemoryTable } from "../support/memory-store.js";

/**
 * DESIGN §4.10: bookkeeping by (id, token). One worker can hold two deliveries of a row (its own lease ran
 * out and it leased the row again); what a write touched is credited to the delivery it names, never to
 * every delivery of the same id. Run on the in-memory lease store, which passes the same contract as the
 * Postgres one (test/lease/lease-store.test.ts).
 */
async function twoDeliveriesOfOneRow() {
  let clock = 0;
  const table = new MemoryTable(() => clock);
  const store = new MemoryLeaseStore(table, { queues: ["q"], leaseTtlMs: 1000 });
  table.insert("q");
  const first = await store.lease(1);
  clock += 2000; // the first lease runs out while its handler still runs
  const second = await store.leaseAlone();
  const [old] = heldRows(first.token, first.rows) as [HeldRow];
  const [fresh] = heldRows(second.token, second.rows) as [HeldRow];
  expect(old.id).toBe(fresh.id);
  return { store, table, old, fresh };
}

/** Acks `rows` through a Completer on `store`; resolves after its first flush, with what landed and was lost. */
async function ackThroughCompleter(store: CompleterDeps["store"], rows: HeldRow[]) {
  const landed: HeldRow[] = [];
  const lost: HeldRow[] = [];
  let done!: () => void;
  const flushed = new Promise<void>((resolve) => {
    done = resolve;
  });
  const completer = new Completer({
    store,
    landed: (o: Outcome) => landed.push(o.held),
    lost: (o: Outcome) => lost.push(o.held),
    flushed: () => done(),
    onError: () => {},
    onFatal: () => {},
    batchSize: 10,
    windowMs: 1,
    backoffBaseMs: 1,
    backoffMaxMs: 1,
    maxConsecutiveFailures: 3,
  });
  for (const h of rows) {
    startCompleting(h);
    completer.submit({ kind: "ack", held: h, durationMs: 1 });
  }
  await flushed;
  return { landed, lost };
}

describe("delivery keys", () => {
  it("the completer credits a write to the delivery it names: the old delivery of the same row is lost", async () => {
    const { store, table, old, fresh } = await twoDeliveriesOfOneRow();
    const { landed, lost } = await ackThroughCompleter(store, [old, fresh]);
    expect(landed).toEqual([fresh]);
    expect(lost).toEqual([old]);
    expect([fresh.state, old.state, table.rows.size]).toEqual(["acked", "completing", 0]);
  });

  it("the heartbeat keeps the delivery whose (id, token) was renewed and reports the other one lost", async () => {
    const { store, old, fresh } = await twoDeliveriesOfOneRow();
    const lost: HeldRow[] = [];
    const heartbeat = new Heartbeat({
      intervalMs: 60_000,
      confirmedForMs: 60_000,
      store,
      collect: () => [old, fresh],
      lost: (h) => lost.push(h),
      onError: () => {},
      onRecovered: () => {},
    });
    await heartbeat.beat();
    expect(lost).toEqual([old]);
  });

  it("a write that committed but lost its answer is reported as landed, not as a lost lease", async () => {
    const table = new MemoryTable(() => 0);
    const inner = new MemoryLeaseStore(table, { queues: ["q"], leaseTtlMs: 1000 });
    table.insert("q");
    table.insert("q");
    const lease = await inner.lease(2);
    const [a, b] = heldRows(lease.token, lease.rows) as [HeldRow, HeldRow];
    let cut = true;
    // The first ack commits, then the connection drops before its answer: the completer writes again.
    const store = {
      ack: async (writes: Parameters<typeof inner.ack>[0]) => {
        const landed = await inner.ack(writes);
        if (cut) {
          cut = false;
          throw new Error("connection terminated unexpectedly");
        }
        return landed;
      },
      retry: inner.retry.bind(inner),
      deadLetter: inner.deadLetter.bind(inner),
      whereabouts: inner.whereabouts.bind(inner),
    };
    const { landed, lost } = await ackThroughCompleter(store, [a, b]);
    expect(lost).toEqual([]);
    expect(landed).toEqual([a, b]);
    expect([a.state, b.state, table.rows.size]).toEqual(["acked", "acked", 0]);
  });
});
