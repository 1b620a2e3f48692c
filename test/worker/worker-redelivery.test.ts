import { beforeAll, beforeEach, describe, expect, it } from "vitest";
import { testDatabase } from "../support/database.js";
import { startPostgresProxy, throughProxy } from "../support/tcp-proxy.js";
import { publisherFor, until, workerFactory } from "../support/worker.js";

/**
 * DESIGN §4.10: a worker's bookkeeping is keyed by (id, token). When this worker's own lease on a row runs
 * out while it still runs the row, and it leases the row again, the old delivery's late outcome must not
 * touch the new delivery: the new lease keeps its heartbeat, and the row is delivered exactly twice.
 */
const db = testDatabase("redel");
const workers = workerFactory(db);
const outbox = publisherFor(db.schema);

beforeAll(() => db.migrate());
beforeEach(async () => {
  await db.pool.query(`TRUNCATE ${db.names.messages}, ${db.names.deadLetters}`);
});

async function count(table: "messages" | "deadLetters"): Promise<number> {
  return (await db.pool.query(`SELECT count(*)::int AS n FROM ${db.names[table]}`)).rows[0].n;
}

const sleep = (ms: number, signal?: AbortSignal) =>
  new Promise<void>((resolve) => {
    const timer = setTimeout(resolve, ms);
    signal?.addEventListener("abort", () => {
      clearTimeout(timer);
      resolve();
    });
  });

describe("a row this worker still runs after its own lease ran out", () => {
  it("is not leased again by the same worker: the running delivery keeps it, is renewed and acked once", async () => {
    const [id] = await db.inTransaction((c) => outbox.publishMany(c, "again", [{ payload: {} }]));
    const deliveries: number[] = [];
    const ticks: string[] = [];
    let releaseFirst!: () => void;
    const firstMayEnd = new Promise<void>((resolve) => {
      releaseFirst = resolve;
    });
    const worker = await workers.start({
      leaseTtlMs: 2000,
      // Rare, so the expiries below are seen by the fetches and not undone by a renewal first.
      heartbeatMs: 1000,
      maxDeliveries: 3,
      queues: {
        again: async (_p, m) => {
          deliveries.push(m.deliveries);
          await firstMayEnd;
        },
        tick: (_p, m) => void ticks.push(m.id),
      },
    });
    const lost: { id: string; deliveries: number; phase: string }[] = [];
    const acked: string[] = [];
    worker.on("lease_lost", (e) => lost.push(e));
    worker.on("acked", (e) => acked.push(e.id));
    await until(() => deliveries.length === 1, "first delivery running");
    // Run the lease out, as a blocked event loop would, then make the worker fetch (a row of another queue
    // it serves): that fetch may take the expired row, and must not. Five times, each on a fresh expiry.
    for (let i = 0; i < 5; i++) {
      await db.pool.query(
        `UPDATE ${db.names.messages} SET lease_expires_at = now() - interval '1 second' WHERE id = $1`,
        [id],
      );
      const [tick] = await db.inTransaction((c) => outbox.publishMany(c, "tick", [{ payload: { i } }]));
      await until(() => ticks.includes(tick as string), `tick ${i} fetched and handled`);
    }
    expect(deliveries).toEqual([1]);
    releaseFirst();

    await until(async () => (await count("messages")) === 0, "the row acked", 15_000);
    expect(deliveries).toEqual([1]);
    expect(await count("deadLetters")).toBe(0);
    expect(acked.filter((a) => a === id)).toEqual([id]);
    expect(lost).toEqual([]);
  });

  it("a handler that blocks the event loop past its lease runs once and is acked; the block is reported", async () => {
    const ids = await db.inTransaction((c) =>
      outbox.publishMany(c, "blocking", [{ payload: {} }, { payload: {}, key: "k" }]),
    );
    const runs = new Map<string, number>();
    const worker = await workers.start({
      leaseTtlMs: 1000,
      heartbeatMs: 300,
      maxDeliveries: 3,
      queues: {
        blocking: async (_p, m) => {
          runs.set(m.id, (runs.get(m.id) ?? 0) + 1);
          // Synchronous and longer than the lease: no timer (heartbeat included) runs meanwhile.
          const until = Date.now() + 1500;
          while (Date.now() < until) {}
          // Then some I/O: the worker's timers run (fetch and heartbeat) while this delivery is still running.
          // Which of the two reaches the row first is a race; the test above forces the fetch to.
          await sleep(500);
        },
      },
    });
    const blocked: { blockedMs: number }[] = [];
    worker.on("event_loop_blocked", (e) => blocked.push(e));
    const dead: unknown[] = [];
    worker.on("dead_lettered", (e) => dead.push(e));
    await until(
      async () => (await count("messages")) === 0 || dead.length > 0,
      "both rows acked (or dead-lettered)",
      30_000,
    );
    expect(dead).toEqual([]);
    expect(ids.map((i) => runs.get(i))).toEqual([1, 1]);
    expect(blocked.length).toBeGreaterThan(0);
    expect(Math.max(...blocked.map((b) => b.blockedMs))).toBeGreaterThanOrEqual(1000);
  });

  it("after a database outage longer than the lease, each row is delivered at most twice and acked", async () => {
    const proxy = await startPostgresProxy(db.url);
    try {
      const ids = await db.inTransaction((c) =>
        outbox.publishMany(
          c,
          "outage",
          Array.from({ length: 4 }, (_, i) => ({ payload: { i } })),
        ),
      );
      const deliveries = new Map<string, number[]>();
      const worker = await workers.start({
        connection: throughProxy(db.url, proxy),
        concurrency: 4,
        leaseTtlMs: 2000,
        heartbeatMs: 600,
        loopBackoffBaseMs: 20,
        loopBackoffMaxMs: 200,
        maxConsecutiveFailures: 10_000,
        // A third lease would be a dead letter: the test then fails on it at once.
        maxDeliveries: 2,
        queues: {
          outage: async (_p, m) => {
            deliveries.set(m.id, [...(deliveries.get(m.id) ?? []), m.deliveries]);
            // Longer than the lease: only the heartbeat keeps it.
            await sleep(3000, m.signal);
          },
        },
      });
      const acked = new Set<string>();
      worker.on("acked", (e) => acked.add(e.id));
      await until(() => deliveries.size === 4, "four handlers running");

      // The database becomes unreachable until every lease has run out (read directly, not through the proxy).
      proxy.cut();
      await until(
        async () =>
          (
            await db.pool.query(
              `SELECT count(*)::int AS n FROM ${db.names.messages} WHERE lease_expires_at < now()`,
            )
          ).rows[0].n === 4,
        "every lease expired during the outage",
      );
      proxy.restore();

      await until(async () => (await count("messages")) === 0, "every row acked", 60_000);
      // The DELETE is visible before the worker reports it: after a failed attempt it first reads the rows'
      // fate (did the lost answer carry this ack?), a round trip after the commit.
      await until(() => acked.size === ids.length, "every ack reported");
      expect(await count("deadLetters")).toBe(0);
      expect([...acked].sort()).toEqual([...ids].sort());
      for (const id of ids) {
        const seen = deliveries.get(id) ?? [];
        // Re-leased after the outage (2) or kept by a heartbeat that renewed first (1): never more.
        expect(seen.length, `deliveries of ${id}: ${seen.join(",")}`).toBeLessThanOrEqual(2);
        expect(seen[0]).toBe(1);
      }
      await worker.stop({ timeoutMs: 2000 });
    } finally {
      await proxy.close();
    }
  });
});
