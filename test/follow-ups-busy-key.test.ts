import { beforeAll, beforeEach, describe, expect, it } from "vitest";
import type { PreparedFollowUp } from "../src/contract/follow-up.js";
import { heldRows } from "../src/lease/held.js";
import { createPgLeaseStore } from "../src/lease/pg-store.js";
import { testDatabase } from "./helpers/database.js";
import { publisherFor } from "./helpers/worker.js";

/**
 * A busy follow-up key (a producer of that key, or another worker's ack, has not committed) holds back only
 * the deliveries whose own follow-ups need that key: the rest of their batch lands in the same write. The
 * key is held by a producer's open transaction, so "busy" is certain, not a race.
 */

const db = testDatabase("fubusy");
const outbox = publisherFor(db.schema);

beforeAll(() => db.migrate());
beforeEach(async () => {
  await db.pool.query(`TRUNCATE ${db.names.messages}, ${db.names.deadLetters}`);
});

const follow = (payload: unknown, key: string): PreparedFollowUp => ({
  queue: "child",
  payloadText: JSON.stringify(payload),
  key,
  headers: {},
  delayMs: null,
  availableAt: null,
});

function store(busyRounds: number[]) {
  return createPgLeaseStore({
    pool: () => db.pool,
    names: db.names,
    queues: ["parent"],
    workerId: "w",
    leaseTtlMs: 60_000,
    maxErrorLength: 4000,
    synchronousCommit: false,
    preparedStatements: true,
    queryTimeoutMs: 30_000,
    onKeyBusy: (n) => busyRounds.push(n),
  });
}

async function children(): Promise<unknown[]> {
  const { rows } = await db.pool.query(
    `SELECT payload FROM ${db.names.messages} WHERE queue = 'child' ORDER BY id`,
  );
  return rows.map((r) => r.payload);
}

async function parentsLeft(): Promise<number> {
  const { rows } = await db.pool.query(
    `SELECT count(*)::int AS n FROM ${db.names.messages} WHERE queue = 'parent'`,
  );
  return rows[0].n;
}

describe("a busy follow-up key holds back only the deliveries that need it", () => {
  for (const parentKeys of [false, true]) {
    it(`${parentKeys ? "keyed" : "keyless"} parents: the one whose follow-up key is free lands in the same write, the other waits for the producer`, async () => {
      await db.pool.query(
        `INSERT INTO ${db.names.messages} (queue, payload, key)
         SELECT 'parent', jsonb_build_object('n', g), CASE WHEN $1 THEN 'p' || g END FROM generate_series(1, 3) AS g`,
        [parentKeys],
      );
      const busyRounds: number[] = [];
      const s = store(busyRounds);
      const lease = await s.lease(10);
      const [one, two, three] = heldRows(lease.token, lease.rows);
      if (!one || !two || !three) throw new Error("three parents leased");
      const producer = await db.pool.connect();
      try {
        await producer.query("BEGIN");
        // A producer of key B in flight: its lock is held until it commits.
        await outbox.publish(producer, "child", { from: "producer" }, { key: "B" });
        const landed = await s.ack([
          { held: one, followUps: [follow({ parent: 1 }, "A")] },
          { held: two, followUps: [follow({ parent: 2 }, "A"), follow({ parent: 2 }, "B")] },
          { held: three, followUps: [follow({ parent: 3 }, "C")] },
        ]);
        expect([one, two, three].map((d) => landed.has(d))).toEqual([true, false, true]);
        expect([one, two, three].map((d) => landed.busy?.(d) === true)).toEqual([false, true, false]);
        // Every round named the one delivery whose key is busy, never its batch.
        expect(busyRounds.length).toBeGreaterThan(0);
        expect(new Set(busyRounds)).toEqual(new Set([1]));
        expect(await children()).toEqual([{ parent: 1 }, { parent: 3 }]);
        expect(await parentsLeft()).toBe(1);
        await producer.query("COMMIT");
      } finally {
        await producer.query("ROLLBACK").catch(() => {});
        producer.release();
      }
      const again = await s.ack([
        { held: two, followUps: [follow({ parent: 2 }, "A"), follow({ parent: 2 }, "B")] },
      ]);
      expect(again.has(two)).toBe(true);
      expect(await parentsLeft()).toBe(0);
      // Per-key order: the producer's B committed first, so the follow-up on B comes after it.
      const { rows } = await db.pool.query(
        `SELECT key, payload FROM ${db.names.messages} WHERE queue = 'child' AND key = 'B' ORDER BY id`,
      );
      expect(rows.map((r) => r.payload)).toEqual([{ from: "producer" }, { parent: 2 }]);
    });
  }
});
