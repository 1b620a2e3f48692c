import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { Completer, type CompleterDeps, type Outcome } from "../../src/complete/completer.js";
import { type HeldRow, heldRows, startCompleting } from "../../src/lease/held.js";
import type { AckWrite, Landed } from "../../src/lease/store.js";
import { MemoryLeaseStore, MemoryTable } from "../support/memory-store.js";

/**
 * An outcome the store answers busy (a producer of its key has not committed) is neither landed nor lost:
 * the completer writes it again after a pause, counts it pending meanwhile, and drops it if its lease is
 * lost. The store here is the in-memory one, with a key made busy for as long as a test says.
 */
async function setup() {
  const table = new MemoryTable(() => 0);
  const memory = new MemoryLeaseStore(table, { queues: ["q"], leaseTtlMs: 60_000 });
  table.insert("q");
  table.insert("q");
  const lease = await memory.lease(2);
  const [busyRow, freeRow] = heldRows(lease.token, lease.rows) as [HeldRow, HeldRow];
  let busy = true;
  const calls: string[][] = [];
  const store: CompleterDeps["store"] = {
    retry: (w) => memory.retry(w),
    deadLetter: (w, n) => memory.deadLetter(w, n),
    whereabouts: (d) => memory.whereabouts(d),
    async ack(writes: readonly AckWrite[]): Promise<Landed> {
      calls.push(writes.map((w) => w.held.id));
      const held = busy ? writes.filter((w) => w.held.id !== busyRow.id) : writes;
      const landed = await memory.ack(held);
      if (!busy) return landed;
      // Not written: the landed set of the rest (which may say "all") must not claim it.
      return {
        ...landed,
        has: (d) => d.id !== busyRow.id && landed.has(d),
        busy: (d) => d.id === busyRow.id,
      };
    },
  };
  const landed: HeldRow[] = [];
  const lost: HeldRow[] = [];
  const errors: Error[] = [];
  const waits: [string, number][] = [];
  const completer = new Completer({
    longWait: { afterMs: 5000, report: (o, waitedMs) => waits.push([o.held.id, waitedMs]) },
    store,
    landed: (o: Outcome) => landed.push(o.held),
    lost: (o: Outcome) => lost.push(o.held),
    flushed: () => {},
    onError: (e) => errors.push(e),
    onFatal: () => {},
    batchSize: 10,
    windowMs: 1,
    backoffBaseMs: 1,
    backoffMaxMs: 1,
    maxConsecutiveFailures: 1,
  });
  for (const h of [busyRow, freeRow]) {
    startCompleting(h);
    completer.submit({ kind: "ack", held: h, durationMs: 1 });
  }
  return {
    completer,
    table,
    busyRow,
    freeRow,
    calls,
    landed,
    lost,
    errors,
    waits,
    commit: () => {
      busy = false;
    },
  };
}

// Fake timers: the pauses between writes are run out, not slept through, so "nothing more is written" is
// checked after every timer the completer could have set has fired.
beforeEach(() => {
  vi.useFakeTimers();
});
afterEach(() => {
  vi.useRealTimers();
});
const runTimers = (ms: number) => vi.advanceTimersByTimeAsync(ms);

describe("completer: outcomes answered busy", () => {
  it("writes a busy outcome again until it lands, pending meanwhile, and never calls it lost or failed", async () => {
    const s = await setup();
    await runTimers(3000);
    expect(s.calls.length).toBeGreaterThanOrEqual(3);
    expect(s.landed).toEqual([s.freeRow]);
    expect(s.completer.pending).toBe(1);
    expect(s.completer.failing).toBe(false);
    // Only the busy one is written again.
    expect(s.calls.slice(1).every((c) => c.length === 1 && c[0] === s.busyRow.id)).toBe(true);
    s.commit();
    await runTimers(3000);
    expect(s.landed).toEqual([s.freeRow, s.busyRow]);
    expect([s.lost, s.errors, s.completer.pending, s.table.rows.size]).toEqual([[], [], 0, 0]);
  });

  it("reports a wait once it has lasted longWait.afterMs, and only once", async () => {
    const s = await setup();
    await runTimers(4000);
    expect(s.waits).toEqual([]);
    await runTimers(2500);
    expect(s.waits.map(([id]) => id)).toEqual([s.busyRow.id]);
    expect(s.waits[0]?.[1]).toBeGreaterThanOrEqual(5000);
    await runTimers(20_000);
    expect(s.waits).toHaveLength(1);
  });

  it("drops a waiting outcome whose lease was lost (forget): nothing more is written for it", async () => {
    const s = await setup();
    await runTimers(100);
    expect(s.calls.length).toBeGreaterThanOrEqual(1);
    s.completer.forget(s.busyRow);
    expect(s.completer.pending).toBe(0);
    const writes = s.calls.length;
    await runTimers(10_000);
    expect(s.calls.length).toBe(writes);
    expect(s.landed).toEqual([s.freeRow]);
  });

  it("stop() ends the waiting: nothing is written after it", async () => {
    const s = await setup();
    await runTimers(100);
    expect(s.calls.length).toBeGreaterThanOrEqual(1);
    s.completer.stop();
    const writes = s.calls.length;
    await runTimers(10_000);
    expect(s.calls.length).toBe(writes);
  });
});
