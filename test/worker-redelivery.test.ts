import { beforeAll, beforeEach, describe, expect, it } from "vitest";
import { testDatabase } from "./helpers/database.js";
import { startPostgresProxy, throughProxy } from "./helpers/tcp-proxy.js";
import { publisherFor, until, workerFactory } from "./helpers/worker.js";

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

describe("a row this worker leases again after its own lease ran out", () => {
  it("is delivered exactly twice and acked: the old delivery's refused outcome leaves the new lease's heartbeat alone", async () => {
    const [id] = await db.inTransaction((c) => outbox.publishMany(c, "again", [{ payload: {} }]));
    const deliveries: number[] = [];
    let releaseFirst!: () => void;
    const firstMayEnd = new Promise<void>((resolve) => {
      releaseFirst = resolve;
    });
    const worker = await workers.start({
      leaseTtlMs: 2000,
      heartbeatMs: 600,
      // Low, so a bookkeeping bug ends in a dead letter quickly instead of redelivering for minutes.
      maxDeliveries: 3,
      queues: {
        again: async (_p, m) => {
          deliveries.push(m.deliveries);
          // The first delivery ignores its abort and returns only when the test says so: its ack is then
          // refused (another token holds the row) and runs the lost-lease cleanup while the second runs.
          if (m.deliveries === 1) await firstMayEnd;
          // Longer than the lease: only the heartbeat keeps this delivery's lease alive.
          else await sleep(3000, m.signal);
        },
      },
    });
    const lost: { id: string; deliveries: number; phase: string }[] = [];
    const acked: string[] = [];
    worker.on("lease_lost", (e) => lost.push(e));
    worker.on("acked", (e) => acked.push(e.id));

    await until(() => deliveries.length === 1, "first delivery running");
    // Run the first lease out, as a stalled heartbeat or a database outage would. Repeated until the row
    // is leased again: the heartbeat may renew the (expired, still ours) lease in between, which is fine.
    await until(async () => {
      if (deliveries.length >= 2) return true;
      await db.pool.query(
        `UPDATE ${db.names.messages} SET lease_expires_at = now() - interval '1 second' WHERE deliveries_count = 1`,
      );
      return false;
    }, "the same worker leases the row again");
    expect(deliveries).toEqual([1, 2]);
    releaseFirst();

    await until(async () => (await count("messages")) === 0, "the row acked", 60_000);
    expect(deliveries).toEqual([1, 2]);
    expect(await count("deadLetters")).toBe(0);
    expect(acked).toEqual([id]);
    // Only the first delivery lost its lease.
    expect(lost.map((l) => l.deliveries)).toEqual([1]);
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
