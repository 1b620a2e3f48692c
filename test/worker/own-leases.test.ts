import pino from "pino";
import { describe, expect, it } from "vitest";
import type { Delivery } from "../../src/lease/store.js";
import { WorkerEmitter } from "../../src/worker/events.js";
import { OwnLeases } from "../../src/worker/own-leases.js";
import { MemoryLeaseStore, MemoryTable } from "../support/memory-store.js";

/** Which tokens a worker counts as its own, and what it takes back, on a memory store and a stopped clock. */
function harness() {
  let now = 0;
  const table = new MemoryTable(() => 1_000_000 + now);
  const store = new MemoryLeaseStore(table, { queues: ["q"], leaseTtlMs: 1000 });
  const held: Delivery[] = [];
  const emitter = new WorkerEmitter(() => {});
  const events: unknown[] = [];
  emitter.on("reclaimed", (e) => events.push(e));
  let wakes = 0;
  const own = new OwnLeases({
    store,
    held: () => held,
    keepMs: 1000,
    log: pino({ level: "silent" }),
    emitter,
    wake: () => void wakes++,
    now: () => now,
  });
  return {
    table,
    store,
    held,
    own,
    events,
    wakes: () => wakes,
    advance: (ms: number) => {
      now += ms;
    },
  };
}

describe("OwnLeases", () => {
  it("counts a token as its own while a lease under it may be live: renewed, it stays; a TTL after its last write, it goes", async () => {
    const h = harness();
    h.table.insert("q");
    h.table.insert("q");
    const first = await h.store.lease(1);
    const second = await h.store.lease(1);
    const [a, b] = [first, second].map((l) => ({ id: l.rows[0]?.id as string, token: l.token }));
    h.own.wrote([a as Delivery]);
    h.own.wrote([b as Delivery]);
    // The heartbeat renews b only (a's handler finished long ago).
    for (let i = 0; i < 5; i++) {
      h.advance(400);
      h.own.wrote([b as Delivery]);
    }
    expect(h.own.tokens()).toEqual([second.token]);
    h.advance(1000);
    expect(h.own.tokens()).toEqual([second.token]);
    h.advance(1);
    expect(h.own.tokens()).toEqual([]);
  });

  it("takes back the rows under its tokens that it no longer holds, says so, and wakes the fetch", async () => {
    const h = harness();
    for (let i = 0; i < 3; i++) h.table.insert("q");
    const lease = await h.store.lease(3);
    const [kept, stale1, stale2] = lease.rows.map((r) => ({ id: r.id, token: lease.token }));
    h.own.wrote([kept as Delivery, stale1 as Delivery, stale2 as Delivery]);
    h.held.push(kept as Delivery);
    expect(await h.own.reclaim()).toBe(2);
    expect(h.events).toEqual([{ count: 2, queues: { q: 2 } }]);
    expect(h.wakes()).toBe(1);
    expect(h.table.rows.get(kept?.id as string)?.leaseExpiresAt).toBe(1_000_000 + 1000);
    // Nothing left to take back: no event, no wake-up.
    expect(await h.own.reclaim()).toBe(0);
    expect(h.events).toHaveLength(1);
    expect(h.wakes()).toBe(1);
  });
});
