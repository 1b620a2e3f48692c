import { randomUUID } from "node:crypto";
import { describe, expect, it } from "vitest";
import type { PreparedFollowUp } from "../../../src/contract/follow-up.js";
import type { Delivery, LeaseStore } from "../../../src/lease/store.js";

/** What the contract needs to see and steer in a store's backing table. */
export interface LeaseStoreHarness {
  /** A store for the queues `a` and `b`; a second call is a second worker on the same table. */
  store(options?: {
    leaseTtlMs?: number;
    workerId?: string;
    maxErrorLength?: number;
    unorderedQueues?: string[];
  }): LeaseStore;
  /**
   * `n` new rows in `queue`, due now unless delayed, all with `key` if given; ids in insertion (= age) order.
   * `padding`: the payload is `{"p": "xxx…"}` with that many x (small enough to be stored uncompressed).
   */
  insert(
    queue: string,
    n: number,
    options?: { delayMs?: number; key?: string; padding?: number },
  ): Promise<string[]>;
  /** Every lease ends now (as if its holder stalled past its TTL). */
  expireLeases(): Promise<void>;
  /** Every scheduled row is due now. */
  makeDue(): Promise<void>;
  row(id: string): Promise<
    | {
        leased: boolean;
        token: string | null;
        deliveries: number;
        attempts: number;
        failures: number;
        lastError: string | null;
        due: boolean;
        leaseLeftMs: number | null;
      }
    | undefined
  >;
  deadLetter(id: string): Promise<{ reason: string; error: string | null; attempts: number } | undefined>;
  /** The rows of `queue` in id order, as follow-up checks read them. */
  rowsOf(queue: string): Promise<{ payload: unknown; key: string | null; head: boolean; headers: object }[]>;
}

const follow = (queue: string, payload: unknown, key: string | null = null): PreparedFollowUp => ({
  queue,
  payloadText: JSON.stringify(payload),
  key,
  headers: { h: queue },
  delayMs: null,
  availableAt: null,
});

const deliveries = (token: string, ids: readonly string[]): Delivery[] => ids.map((id) => ({ id, token }));

/**
 * The lease store's contract: the Postgres store and the in-memory one must both pass it, so tests run
 * on the memory store prove something about the real one.
 */
export function leaseStoreContract(name: string, harness: () => LeaseStoreHarness): void {
  describe(`lease store contract: ${name}`, () => {
    it("leases due rows of its queues, oldest first in each, taking turns between them, up to the limit, under one fresh token", async () => {
      const h = harness();
      const store = h.store();
      const a = await h.insert("a", 3);
      const b = await h.insert("b", 2);
      await h.insert("other", 2);
      await h.insert("a", 1, { delayMs: 60_000 });
      const first = await store.lease(4);
      // Strictly oldest first would take a's three and one of b's: each queue gives up as much as the other.
      const byId = (x: string, y: string) => Number(x) - Number(y);
      expect(first.rows.map((r) => r.id).sort(byId)).toEqual([a[0], a[1], b[0], b[1]]);
      expect(first.rows.every((r) => r.deliveries_count === 1)).toBe(true);
      const second = await store.lease(10);
      expect(second.rows.map((r) => r.id)).toEqual([a[2]]);
      expect(second.token).not.toBe(first.token);
      expect((await h.row(a[0] ?? ""))?.token).toBe(first.token);
      expect((await store.lease(10)).rows).toEqual([]);
    });

    it("a lease stops before its payloads sum past maxBytes, and always takes its first row", async () => {
      const h = harness();
      const store = h.store();
      const ids = await h.insert("a", 4, { padding: 1000 });
      // About 1,010 bytes each (text or stored): two fit in 2,500, a third would not.
      expect((await store.lease(10, 2500)).rows.map((r) => r.id)).toEqual(ids.slice(0, 2));
      // A budget smaller than one row still delivers that row, alone.
      expect((await store.lease(10, 10)).rows.map((r) => r.id)).toEqual(ids.slice(2, 3));
      expect((await store.lease(10)).rows.map((r) => r.id)).toEqual(ids.slice(3));
    });

    it("per-key order: only a key's head is leased; ack or dead-letter hands on to the next, retry does not", async () => {
      const h = harness();
      const store = h.store();
      const k1 = await h.insert("a", 3, { key: "k1" });
      const [free] = await h.insert("a", 1);
      const [k2] = await h.insert("a", 1, { key: "k2" });
      const ids = async (limit = 10) => {
        const lease = await store.lease(limit);
        return { token: lease.token, ids: lease.rows.map((r) => r.id) };
      };
      const first = await ids();
      expect(first.ids).toEqual([k1[0], free, k2]);
      // A retry keeps the head in place: the next row of its key stays blocked.
      const [h1] = deliveries(first.token, [k1[0] as string]);
      await store.retry([{ held: h1 as Delivery, delayMs: 0, error: "x", failed: 1 }]);
      const again = await ids();
      expect(again.ids).toEqual([k1[0]]);
      // Acked (key unknown to the caller: treated as keyed), the head hands on to the next row of its key.
      expect((await store.ack(deliveries(again.token, again.ids).map((held) => ({ held })))).count).toBe(1);
      const next = await ids();
      expect(next.ids).toEqual([k1[1]]);
      // Dead-lettered, likewise.
      const dead = deliveries(next.token, next.ids).map((held) => ({
        held,
        reason: "rejected",
        error: "x",
        attempted: 1 as const,
        failed: 1 as const,
      }));
      expect((await store.deadLetter(dead)).count).toBe(1);
      expect((await ids()).ids).toEqual([k1[2]]);
      expect(await ids()).toMatchObject({ ids: [] });
    });

    it("per-key order is off for unordered queues: every due row of a key is leased", async () => {
      const h = harness();
      const keyed = await h.insert("b", 3, { key: "k" });
      const [other] = await h.insert("a", 2, { key: "j" });
      const store = h.store({ unorderedQueues: ["b"] });
      const lease = await store.lease(10);
      expect(lease.rows.map((r) => r.id).sort()).toEqual([...keyed, other].sort());
    });

    it("ack inserts a delivery's follow-ups only when its delete matched the token", async () => {
      const h = harness();
      const store = h.store();
      const [mine, stale] = await h.insert("a", 2);
      const lease = await store.lease(2);
      const landed = await store.ack([
        {
          held: { id: mine ?? "", token: lease.token, key: null },
          followUps: [follow("b", { n: 0 }), follow("b", { n: 1 }, "k")],
        },
        // A delivery whose lease was taken over: neither its delete nor its follow-up happens.
        { held: { id: stale ?? "", token: randomUUID(), key: null }, followUps: [follow("b", { n: 2 })] },
      ]);
      expect([landed.has({ id: mine ?? "", token: lease.token }), landed.count]).toEqual([true, 1]);
      expect(await h.row(stale ?? "")).toMatchObject({ token: lease.token });
      expect(await h.rowsOf("b")).toEqual([
        { payload: { n: 0 }, key: null, head: true, headers: { h: "b" } },
        { payload: { n: 1 }, key: "k", head: true, headers: { h: "b" } },
      ]);
    });

    it("a keyed ack's follow-up into the same key queues behind the key's next row", async () => {
      const h = harness();
      const store = h.store();
      const [head, next] = await h.insert("a", 2, { key: "p" });
      const lease = await store.lease(10);
      expect(lease.rows.map((r) => r.id)).toEqual([head]);
      const stale = await store.ack([
        {
          held: { id: head ?? "", token: randomUUID(), key: "p" },
          followUps: [follow("a", { lost: true }, "p")],
        },
      ]);
      expect(stale.count).toBe(0);
      await store.ack([
        {
          held: { id: head ?? "", token: lease.token, key: "p" },
          followUps: [follow("a", { step: 2 }, "p")],
        },
      ]);
      expect(await h.rowsOf("a")).toEqual([
        { payload: {}, key: "p", head: true, headers: {} },
        { payload: { step: 2 }, key: "p", head: false, headers: { h: "a" } },
      ]);
      expect((await store.lease(10)).rows.map((r) => r.id)).toEqual([next]);
    });

    it("takes over an expired lease alone, under a new token; the old delivery's writes land nowhere", async () => {
      const h = harness();
      const [one, two] = [h.store({ workerId: "one" }), h.store({ workerId: "two" })];
      const ids = await h.insert("a", 2);
      const old = await one.lease(10);
      await h.expireLeases();
      // Held through a crash: never leased in a batch, only alone, one row per lease, oldest first.
      expect((await two.lease(10)).rows).toEqual([]);
      expect(await two.suspectsWaiting()).toBe(true);
      const alone = [await two.leaseAlone(), await two.leaseAlone()];
      expect((await two.leaseAlone()).rows).toEqual([]);
      expect(await two.suspectsWaiting()).toBe(false);
      expect(alone.map((l) => l.rows.map((r) => [r.id, r.deliveries_count]))).toEqual(
        ids.map((id) => [[id, 2]]),
      );
      const tokenOf = new Map(alone.map((l, i) => [ids[i] as string, l.token]));

      const stale = deliveries(old.token, ids);
      for (const landed of [
        await one.renew(stale),
        await one.ack(stale.map((held) => ({ held }))),
        await one.retry(stale.map((held) => ({ held, delayMs: 0, error: "x", failed: 1 as const }))),
        await one.deadLetter(
          stale.map((held) => ({
            held,
            reason: "rejected",
            error: "x",
            attempted: 1 as const,
            failed: 1 as const,
          })),
        ),
        await one.release(stale),
      ]) {
        expect(landed.count).toBe(0);
        expect(stale.some((d) => landed.has(d))).toBe(false);
      }
      for (const id of ids) expect((await h.row(id))?.token).toBe(tokenOf.get(id));

      const current = ids.map((id) => ({ id, token: tokenOf.get(id) as string }));
      const acked = await two.ack(current.map((held) => ({ held })));
      expect(current.every((d) => acked.has(d))).toBe(true);
      for (const id of ids) expect(await h.row(id)).toBeUndefined();
    });

    it("an expired lease under a token the caller keeps is not taken again; another store takes it", async () => {
      const h = harness();
      const [one, two] = [h.store({ workerId: "one" }), h.store({ workerId: "two" })];
      const ids = await h.insert("a", 2);
      const running = await one.lease(10);
      await h.expireLeases();
      // The same worker, still running both deliveries: its next fetch leaves them alone.
      expect((await one.leaseAlone([running.token])).rows).toEqual([]);
      expect(await one.suspectsWaiting([running.token])).toBe(false);
      const kept = deliveries(running.token, ids);
      expect((await one.renew(kept)).count).toBe(2);
      for (const id of ids) expect((await h.row(id))?.deliveries).toBe(1);
      // Another worker knows nothing of that token: an expired lease is fair game for it (alone).
      await h.expireLeases();
      expect([(await two.leaseAlone()).rows, (await two.leaseAlone()).rows].flat().map((r) => r.id)).toEqual(
        ids,
      );
    });

    it("answers per delivery when one write names current and stale deliveries", async () => {
      const h = harness();
      const store = h.store();
      const [x = "", y = ""] = await h.insert("a", 2);
      const first = await store.lease(1);
      await h.expireLeases();
      const againX = await store.leaseAlone();
      const againY = await store.lease(2);
      // The same row twice: the old delivery of x, and the new deliveries of x and y.
      const staleX = { id: x, token: first.token };
      const newX = { id: x, token: againX.token };
      const newY = { id: y, token: againY.token };
      const landed = await store.ack([{ held: staleX }, { held: newY }]);
      expect([landed.has(staleX), landed.has(newY), landed.count]).toEqual([false, true, 1]);
      expect((await h.row(x))?.token).toBe(newX.token);
    });

    it("a keyed ack naming a row's stale and current deliveries lands the current one only", async () => {
      const h = harness();
      const store = h.store();
      const [x = ""] = await h.insert("a", 1, { key: "kx" });
      const [y = ""] = await h.insert("a", 1, { key: "ky" });
      const first = await store.lease(1);
      await h.expireLeases();
      const againX = await store.leaseAlone();
      const againY = await store.lease(2);
      // Queue and key known, as the worker's deliveries carry them: the keyed ack that reads no row first.
      const keyed = (id: string, token: string, key: string): Delivery => ({ id, token, queue: "a", key });
      const staleX = keyed(x, first.token, "kx");
      const newX = keyed(x, againX.token, "kx");
      const newY = keyed(y, againY.token, "ky");
      const landed = await store.ack([{ held: staleX }, { held: newX }, { held: newY }]);
      expect([landed.has(staleX), landed.has(newX), landed.has(newY), landed.count]).toEqual([
        false,
        true,
        true,
        2,
      ]);
      expect(await h.row(x)).toBeUndefined();
    });

    it("retry clears the lease, schedules the row, counts the attempt and keeps the error short", async () => {
      const h = harness();
      const store = h.store({ maxErrorLength: 5 });
      const [id = ""] = await h.insert("a", 1);
      const { token } = await store.lease(1);
      const landed = await store.retry([
        { held: { id, token }, delayMs: 60_000, error: "boom-boom", failed: 1 },
      ]);
      expect(landed.count).toBe(1);
      expect(await h.row(id)).toMatchObject({
        leased: false,
        token: null,
        attempts: 1,
        failures: 1,
        lastError: "boom-",
        due: false,
      });
      expect((await store.lease(1)).rows).toEqual([]);
      await h.makeDue();
      const next = await store.lease(1);
      expect(next.rows.map((r) => [r.id, r.deliveries_count, r.attempts_count])).toEqual([[id, 2, 1]]);
      // A transient failure is an attempt, not a failure.
      await store.retry([{ held: { id, token: next.token }, delayMs: 0, error: "down", failed: 0 }]);
      expect(await h.row(id)).toMatchObject({ attempts: 2, failures: 1, due: true });
    });

    it("deadLetter moves the row with its reason and error, once", async () => {
      const h = harness();
      const store = h.store();
      const [id = ""] = await h.insert("a", 1);
      const { token } = await store.lease(1);
      const write = {
        held: { id, token },
        reason: "rejected",
        error: "no",
        attempted: 1 as const,
        failed: 1 as const,
      };
      expect((await store.deadLetter([write])).count).toBe(1);
      expect(await h.row(id)).toBeUndefined();
      expect(await h.deadLetter(id)).toEqual({ reason: "rejected", error: "no", attempts: 1 });
      expect((await store.deadLetter([write])).count).toBe(0);
    });

    it("release hands rows back without counting the delivery; renew extends only current leases", async () => {
      const h = harness();
      const store = h.store({ leaseTtlMs: 60_000 });
      const ids = await h.insert("a", 2);
      const lease = await store.lease(2);
      const [x, y] = deliveries(lease.token, ids) as [Delivery, Delivery];
      expect((await store.release([x])).has(x)).toBe(true);
      expect(await h.row(x.id)).toMatchObject({ leased: false, deliveries: 0, due: true });
      // Released: the delivery is gone, so renewing it lands nothing; y's lease is renewed.
      const renewed = await store.renew([x, y]);
      expect([renewed.has(x), renewed.has(y)]).toEqual([false, true]);
      const left = (await h.row(y.id))?.leaseLeftMs ?? 0;
      expect(left).toBeGreaterThan(50_000);
      expect(left).toBeLessThanOrEqual(60_000);
    });

    it("reclaim clears only its own tokens' leases of rows not held: not another process's of the same workerId", async () => {
      const h = harness();
      // One host name, two processes: acquired_by is the same, the tokens are not.
      const [mine, theirs] = [h.store({ workerId: "host" }), h.store({ workerId: "host" })];
      const ids = await h.insert("a", 5);
      const lease = await mine.lease(3);
      const other = await theirs.lease(2);
      const [kept, stale, alsoStale] = deliveries(lease.token, ids.slice(0, 3)) as [
        Delivery,
        Delivery,
        Delivery,
      ];
      expect(await mine.reclaim([], [kept])).toEqual([]);
      const taken = await mine.reclaim([lease.token, randomUUID()], [kept]);
      expect(taken.map((r) => r.id).sort()).toEqual([stale.id, alsoStale.id].sort());
      expect(taken.every((r) => r.queue === "a" && r.token === lease.token)).toBe(true);
      // Cleared, and still counted: unlike release, the delivery that ended without an outcome stays.
      for (const d of [stale, alsoStale]) {
        expect(await h.row(d.id)).toMatchObject({ leased: false, deliveries: 1, due: true });
      }
      expect(await h.row(kept.id)).toMatchObject({ token: lease.token });
      expect((await h.row(kept.id))?.leaseLeftMs).toBeGreaterThan(10_000);
      for (const id of ids.slice(3)) {
        expect(await h.row(id)).toMatchObject({ token: other.token });
        expect((await h.row(id))?.leaseLeftMs).toBeGreaterThan(10_000);
      }
      const again = await theirs.lease(10);
      expect(again.rows.map((r) => [r.id, r.deliveries_count]).sort()).toEqual(
        [
          [stale.id, 2],
          [alsoStale.id, 2],
        ].sort(),
      );
      expect(await mine.reclaim([lease.token], [kept])).toEqual([]);
    });

    it("whereabouts tells a held, unleased, taken, dead-lettered and deleted row apart, in input order", async () => {
      const h = harness();
      const [one, two] = [h.store({ workerId: "one" }), h.store({ workerId: "two" })];
      const ids = await h.insert("a", 5);
      const lease = await one.lease(5);
      const [held, unleased, taken, dead, gone] = deliveries(lease.token, ids) as [
        Delivery,
        Delivery,
        Delivery,
        Delivery,
        Delivery,
      ];
      await one.retry([{ held: unleased, delayMs: 60_000, error: "x", failed: 1 }]);
      await one.deadLetter([{ held: dead, reason: "rejected", error: "x", attempted: 1, failed: 1 }]);
      await one.ack([{ held: gone }]);
      await one.release([taken]);
      await two.lease(5); // takes the released row under its own token
      expect(await one.whereabouts([gone, held, taken, unleased, dead])).toEqual([
        "gone",
        "held",
        "taken",
        "unleased",
        "dead",
      ]);
    });
  });
}
