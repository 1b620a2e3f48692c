import { randomUUID } from "node:crypto";
import { beforeAll, beforeEach, describe, expect, it } from "vitest";
import { createPgLeaseStore } from "../../src/lease/pg-store.js";
import { runQuery } from "../../src/sql/executor.js";
import { fetchStatement } from "../../src/sql/fetch.js";
import { testDatabase } from "../support/database.js";

/**
 * A worker serving several queues splits each fetch between them (QueueShares): each queue's scan stops at
 * its share, so leasing `limit` rows reads and locks about `limit` rows, not `limit` per queue, and a
 * backlog of old rows in one queue does not hold back another queue's rows.
 */
const db = testDatabase("shares");
const m = db.names.messages;

async function insert(queue: string, n: number, ageS: number): Promise<void> {
  await db.pool.query(
    `INSERT INTO ${m} (queue, payload, created_at, available_at)
     SELECT $1, jsonb_build_object('n', g), now() - $3 * interval '1 second', now() - $3 * interval '1 second'
     FROM generate_series(1, $2) AS g`,
    [queue, n, ageS],
  );
}

function store(queues: string[]) {
  return createPgLeaseStore({
    pool: () => db.pool,
    names: db.names,
    queues,
    workerId: "w-shares",
    leaseTtlMs: 30_000,
    maxErrorLength: 2000,
    synchronousCommit: false,
    preparedStatements: true,
    queryTimeoutMs: 10_000,
  });
}

beforeAll(async () => {
  await db.migrate();
});
beforeEach(async () => {
  await db.pool.query(`DELETE FROM ${m}`);
});

describe("one fetch over several queues", () => {
  it("locks only the rows it leases: each queue's scan stops at its share", async () => {
    for (const q of ["a", "b", "c"]) await insert(q, 300, 60);
    const client = await db.pool.connect();
    try {
      await client.query("BEGIN");
      const leased = await runQuery(client, fetchStatement(db.names, { synchronousCommit: false }), {
        queues: ["a", "b", "c"],
        limit: 30,
        shares: [10, 10, 10],
        token: randomUUID(),
        leaseTtlMs: 30_000,
        workerId: "w",
      });
      expect(leased).toHaveLength(30);
      // Still inside the fetch's transaction: every row its scans locked is locked now, picked or not.
      const { rows } = await db.pool.query(
        `SELECT count(*)::int AS free FROM (SELECT id FROM ${m} FOR UPDATE SKIP LOCKED) AS f`,
      );
      expect(900 - rows[0].free, "rows locked by one fetch of 30").toBe(30);
    } finally {
      await client.query("ROLLBACK");
      client.release();
    }
  });

  it("takes turns between queues: one queue's backlog of older rows does not hold back another's", async () => {
    await insert("a", 1000, 600);
    await insert("b", 5, 1);
    const s = store(["a", "b"]);
    const byQueue = (rows: readonly { queue: string }[], q: string) =>
      rows.filter((r) => r.queue === q).length;
    // Oldest first over both queues would take 500 of a's older rows and none of b's.
    const first = await s.lease(500);
    expect([byQueue(first.rows, "a"), byQueue(first.rows, "b")]).toEqual([495, 5]);
    // a was cut short, b ran out: a gets the whole limit, b a small share beside it, still taken first.
    await insert("b", 5, 1);
    const second = await s.lease(500);
    expect([byQueue(second.rows, "a"), byQueue(second.rows, "b")]).toEqual([495, 5]);
  });

  it("splits fetches between busy queues; says more wait after a short fetch whose queue filled its share", async () => {
    for (const q of ["a", "b", "c"]) await insert(q, 1000, 60);
    const s = store(["a", "b", "c"]);
    const counts = (rows: readonly { queue: string }[]) =>
      ["a", "b", "c"].map((q) => rows.filter((r) => r.queue === q).length);
    expect(counts((await s.lease(300)).rows)).toEqual([100, 100, 100]);
    expect(counts((await s.lease(300)).rows)).toEqual([100, 100, 100]);
    // b and c run dry; a's share was 100 of a limit of 300: a short fetch, but a may have more.
    await db.pool.query(`DELETE FROM ${m} WHERE queue IN ('b', 'c') AND acquired_token IS NULL`);
    const short = await s.lease(300);
    expect(counts(short.rows)).toEqual([100, 0, 0]);
    expect(short.more).toBe(true);
    // a alone is busy now: the whole limit but the floors of the quiet ones.
    expect(counts((await s.lease(300)).rows)).toEqual([300, 0, 0]);
    const last = await s.lease(600);
    expect(counts(last.rows)).toEqual([400, 0, 0]);
    expect(last.more).toBe(false);
  });
});
