import pg from "pg";
import { afterAll, beforeAll, beforeEach, describe, expect, it } from "vitest";
import type { PreparedFollowUp } from "../../src/contract/follow-up.js";
import { heldRows } from "../../src/lease/held.js";
import { createPgLeaseStore } from "../../src/lease/pg-store.js";
import { ACK_TURN, ACK_TURN_ID, KEY_LOCK } from "../../src/sql/key-lock.js";
import { testDatabase } from "../support/database.js";
import { publisherFor, until } from "../support/worker.js";

/**
 * A busy follow-up key (a producer of that key has not committed) holds back only the deliveries whose own
 * follow-ups need that key: the rest of their batch lands in the same write. And two acks whose follow-ups
 * share a key (two workers) never refuse each other: the second waits for its turn. The key, or the first
 * ack, is held by an open transaction of the test, so "busy" and "in flight" are certain, not a race.
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

const pools: pg.Pool[] = [];
afterAll(async () => {
  await Promise.all(pools.map((p) => p.end()));
});

/** A lease store; `name` is its connections' application_name. */
function store(busyRounds: number[], name?: string, queryTimeoutMs = 30_000) {
  const pool = name ? new pg.Pool({ connectionString: db.url, application_name: name }) : db.pool;
  if (name) pools.push(pool);
  return createPgLeaseStore({
    pool: () => pool,
    names: db.names,
    queues: ["parent"],
    workerId: "w",
    leaseTtlMs: 60_000,
    maxErrorLength: 4000,
    synchronousCommit: false,
    preparedStatements: true,
    queryTimeoutMs,
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

/** Whether a session named `name` waits for a lock (of that wait event, if given). */
async function waiting(name: string, event?: string): Promise<boolean> {
  const { rows } = await db.pool.query(
    `SELECT count(*)::int AS n FROM pg_stat_activity
     WHERE application_name = $1 AND wait_event_type = 'Lock' AND ($2::text IS NULL OR wait_event = $2)`,
    [name, event ?? null],
  );
  return rows[0].n > 0;
}

describe("two acks whose follow-ups share a key queue for it instead of refusing each other", () => {
  for (const parentKeys of [false, true]) {
    it(`${parentKeys ? "keyed" : "keyless"} parents: the second ack waits while the first holds the key, then lands (at most one round later)`, async () => {
      await db.pool.query(
        `INSERT INTO ${db.names.messages} (queue, payload, key)
         SELECT 'parent', jsonb_build_object('n', g), CASE WHEN $1 THEN 'p' || g END FROM generate_series(1, 2) AS g`,
        [parentKeys],
      );
      const tag = `fubusy-${parentKeys ? "k" : "n"}-${process.pid}`;
      const busyOne: number[] = [];
      const busyTwo: number[] = [];
      const one = store(busyOne, `${tag}-1`);
      const two = store(busyTwo, `${tag}-2`);
      const [first] = heldRows(...(await leaseOne(one)));
      const [second] = heldRows(...(await leaseOne(two)));
      if (!first || !second) throw new Error("one parent leased by each store");
      // The test holds the first parent's row: the first ack stops at its delete, holding key S until then.
      const rowLock = await db.pool.connect();
      try {
        await rowLock.query("BEGIN");
        await rowLock.query(`SELECT 1 FROM ${db.names.messages} WHERE id = $1 FOR UPDATE`, [first.id]);
        const ackOne = one.ack([{ held: first, followUps: [follow({ parent: 1 }, "S")] }]);
        await until(() => waiting(`${tag}-1`), "the first ack holds S and waits for the row");
        let settled = false;
        const ackTwo = two.ack([{ held: second, followUps: [follow({ parent: 2 }, "S")] }]);
        void ackTwo.finally(() => {
          settled = true;
        });
        // Refused, the second ack would answer busy on its own; queued, it waits for its turn.
        await until(
          async () => settled || (await waiting(`${tag}-2`, "advisory")),
          "the second ack answered or waits",
        );
        expect(settled).toBe(false);
        await rowLock.query("COMMIT");
        expect((await ackOne).has(first)).toBe(true);
        expect((await ackTwo).has(second)).toBe(true);
      } finally {
        await rowLock.query("ROLLBACK").catch(() => {});
        rowLock.release();
      }
      // The first ack's commit releases its turn and its key lock one after the other: the second, woken by
      // the turn, may try the key in between and find it busy once (seen under six CPU hogs), then lands.
      expect(busyOne).toEqual([]);
      expect(busyTwo.length).toBeLessThanOrEqual(1);
      // S in commit order: the first ack's follow-up, then the second's.
      expect(await children()).toEqual([{ parent: 1 }, { parent: 2 }]);
    });
  }
});

describe("an ack whose turn does not come", () => {
  it("gives up waiting before its query timeout: answered busy, nothing written, no failure; lands once the turn is free", async () => {
    await db.pool.query(`INSERT INTO ${db.names.messages} (queue, payload) VALUES ('parent', '{"n": 1}')`);
    const busyRounds: number[] = [];
    // Its turns are waited for half the query timeout at most.
    const s = store(busyRounds, undefined, 10_000);
    const [parent] = heldRows(...(await leaseOne(s)));
    if (!parent) throw new Error("the parent leased");
    // An ack stuck ahead of it, holding the turn on S.
    const stuck = await db.pool.connect();
    const write = { held: parent, followUps: [follow({ parent: 1 }, "S")] };
    try {
      await stuck.query("BEGIN");
      await stuck.query(`SELECT ${ACK_TURN(ACK_TURN_ID("$1::text", "$2::text"))}`, ["child", "S"]);
      const landed = await s.ack([write]);
      expect(landed.has(parent)).toBe(false);
      expect(landed.busy?.(parent)).toBe(true);
      expect(await parentsLeft()).toBe(1);
      expect(await children()).toEqual([]);
    } finally {
      await stuck.query("ROLLBACK").catch(() => {});
      stuck.release();
    }
    expect((await s.ack([write])).has(parent)).toBe(true);
    expect(await children()).toEqual([{ parent: 1 }]);
  });
});

describe("an ack that waited long for its turn, then finds the key busy", () => {
  it("still retries the key for a while before answering busy (its window starts at the first busy answer)", async () => {
    await db.pool.query(`INSERT INTO ${db.names.messages} (queue, payload) VALUES ('parent', '{"n": 1}')`);
    const busyRounds: number[] = [];
    const tag = `fubusy-late-${process.pid}`;
    const s = store(busyRounds, tag);
    const [parent] = heldRows(...(await leaseOne(s)));
    if (!parent) throw new Error("the parent leased");
    // The turn on S and the key S itself, held by two open transactions of the test.
    const turn = await db.pool.connect();
    const key = await db.pool.connect();
    try {
      await turn.query("BEGIN");
      await turn.query(`SELECT ${ACK_TURN(ACK_TURN_ID("$1::text", "$2::text"))}`, ["child", "S"]);
      await key.query("BEGIN");
      await key.query(`SELECT ${KEY_LOCK("$1::text", "$2::text")}`, ["child", "S"]);
      const started = Date.now();
      const acking = s.ack([{ held: parent, followUps: [follow({ parent: 1 }, "S")] }]);
      // Queued for the turn longer than the busy window (100 ms): the wait itself must not use it up.
      await until(
        async () => Date.now() - started > 300 && (await waiting(tag)),
        "the ack has waited for its turn past the busy window",
      );
      await turn.query("COMMIT");
      const landed = await acking;
      expect(landed.busy?.(parent)).toBe(true);
      // Tried again after the first busy answer, not given up at once.
      expect(busyRounds.length).toBeGreaterThan(1);
    } finally {
      await turn.query("ROLLBACK").catch(() => {});
      await key.query("ROLLBACK").catch(() => {});
      turn.release();
      key.release();
    }
  });
});

/** Leases one row with `s`: its token and rows, for heldRows. */
async function leaseOne(
  s: ReturnType<typeof store>,
): Promise<[string, Awaited<ReturnType<typeof s.lease>>["rows"]]> {
  const lease = await s.lease(1);
  return [lease.token, lease.rows];
}
