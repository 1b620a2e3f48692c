import { beforeAll, describe, expect, it } from "vitest";
import { testDatabase } from "../support/database.js";
import { publisherFor, until, workerFactory } from "../support/worker.js";

// Issue 11: with slow handlers one worker held 24 rows, 20 of them waiting locally, while a second worker
// had none. Local prefetch is bounded by what the dispatch loops can start before the next fetch lands.

const db = testDatabase("prefetch");
const outbox = publisherFor(db.schema);
const workers = workerFactory(db);
beforeAll(() => db.migrate());

/** Rows of `queue` left: each test waits on its own queue, so one that failed leaves the next unaffected. */
async function left(queue: string): Promise<number> {
  const { rows } = await db.pool.query<{ n: number }>(
    `SELECT count(*)::int AS n FROM ${db.names.messages} WHERE queue = $1`,
    [queue],
  );
  return rows[0]?.n ?? 0;
}

async function leasedBy(): Promise<Record<string, number>> {
  const { rows } = await db.pool.query<{ by: string; n: number }>(
    `SELECT acquired_by AS by, count(*)::int AS n FROM ${db.names.messages} WHERE acquired_token IS NOT NULL GROUP BY 1`,
  );
  return Object.fromEntries(rows.map((r) => [r.by, r.n]));
}

describe("prefetch with slow handlers", () => {
  it("a worker keeps about one row beyond its running handlers, so a second worker gets the rest at once", async () => {
    await db.inTransaction((c) =>
      outbox.publishMany(
        c,
        "slow",
        Array.from({ length: 20 }, (_, i) => ({ payload: { i } })),
      ),
    );
    const handler = (ms: number) => () => new Promise<void>((resolve) => setTimeout(resolve, ms));
    // Three seconds per handler: rows a worker keeps ahead grow with its fetch's round trip over the
    // handler's time (4 × (2 × fetch + 1 ms) / handler), and a CI run's round trips (500 ms seen with the
    // whole suite on 2 cores) must not make that more than two.
    const a = await workers.start({ workerId: "a", concurrency: 4, queues: { slow: handler(3000) } });
    // Let a's first handlers finish, so it knows how long they take.
    await until(async () => (await left("slow")) <= 16, "a's first handlers done", 60_000);
    await until(() => a.held >= 4, "a busy again");
    const heldByA = a.held;

    const b = await workers.start({ workerId: "b", concurrency: 4, queues: { slow: handler(3000) } });
    await until(() => b.held >= 4, "b got rows while a was busy");
    const leases = await leasedBy();
    // a: its 4 running handlers plus at most a couple queued; never the whole backlog.
    expect(heldByA).toBeLessThanOrEqual(4 + 2);
    expect(leases.a ?? 0).toBeLessThanOrEqual(4 + 2);
    expect(leases.b ?? 0).toBeGreaterThanOrEqual(4);
    await until(async () => (await left("slow")) === 0, "all delivered", 60_000);
  });

  it("a fresh worker does not lease the whole backlog before its first handler finished", async () => {
    await db.inTransaction((c) =>
      outbox.publishMany(
        c,
        "fresh",
        Array.from({ length: 30 }, (_, i) => ({ payload: { i } })),
      ),
    );
    let release!: () => void;
    const gate = new Promise<void>((resolve) => {
      release = resolve;
    });
    const w = await workers.start({ workerId: "fresh", concurrency: 3, queues: { fresh: () => gate } });
    await until(() => w.held >= 3, "handlers running");
    const before = (await leasedBy()).fresh ?? 0;
    // A negative property needs an observation window, not a sync point: five poll intervals (20 ms here)
    // in which a hoarding worker would lease more.
    await new Promise((resolve) => setTimeout(resolve, 100));
    const after = (await leasedBy()).fresh ?? 0;

    // Its 3 running handlers and one loop's worth queued (no handler has finished yet), of 30 ready rows.
    expect([before, after]).toEqual([6, 6]);
    release();
    await until(async () => (await left("fresh")) === 0, "all delivered", 60_000);
  });
});
