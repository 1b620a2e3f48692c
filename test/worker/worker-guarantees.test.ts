import { beforeAll, beforeEach, describe, expect, it } from "vitest";
import { PermanentError, type Worker } from "../../src/index.js";
import { testDatabase } from "../support/database.js";
import { nextEvent, publisherFor, until, workerFactory } from "../support/worker.js";

/**
 * Guarantees that only a second, competing owner can reveal: each test here fails when the code that keeps
 * the guarantee is taken out (DESIGN §4.3 and §4.10: a lease is renewed for every row the worker holds,
 * and a holder whose lease was taken over writes nothing). Black box: the public worker API and SQL.
 */

const db = testDatabase("grt");
const workers = workerFactory(db);
const outbox = publisherFor(db.schema);

beforeAll(() => db.migrate());
beforeEach(async () => {
  await db.pool.query(`TRUNCATE ${db.names.messages}, ${db.names.deadLetters}`);
});

async function publish(queue: string, n: number): Promise<string[]> {
  return db.inTransaction((c) =>
    outbox.publishMany(
      c,
      queue,
      Array.from({ length: n }, (_, i) => ({ payload: { i } })),
    ),
  );
}

async function count(table: "messages" | "dead_letters", where = "true", params: unknown[] = []) {
  const name = table === "messages" ? db.names.messages : db.names.deadLetters;
  return (await db.pool.query(`SELECT count(*)::int AS n FROM ${name} WHERE ${where}`, params)).rows[0]
    .n as number;
}

/** A promise the test resolves when it chooses. */
function gate() {
  let open!: () => void;
  const opened = new Promise<void>((resolve) => {
    open = resolve;
  });
  return { open, opened };
}

/** Who handled which id, in order. */
function ledger() {
  const entries: { id: string; by: string }[] = [];
  return {
    entries,
    add: (id: string, by: string) => void entries.push({ id, by }),
    by: (who: string) => entries.filter((e) => e.by === who).map((e) => e.id),
  };
}

/** How a delivery ended for this worker: the first outcome event it emits, with the event's name. */
function firstOutcome(worker: Worker): Promise<{ event: string }> {
  return new Promise((resolve) => {
    const offs = (["acked", "retried", "dead_lettered", "lease_lost"] as const).map((event) =>
      worker.on(event, (e: object) => {
        for (const off of offs) off();
        resolve({ event, ...e });
      }),
    );
  });
}

/** Options that keep a worker from fetching again on its own: one fetch at start, the next a minute later. */
const fetchOnce = { listen: false, minPollIntervalMs: 60_000, maxPollIntervalMs: 60_000 } as const;

describe("heartbeat", () => {
  it("rows waiting in the local queue keep their lease past the TTL: a competing worker never gets them", async () => {
    // A quick "warm" row first: once a handler has finished fast, the worker queues rows locally.
    await publish("warm", 1);
    const ids = await publish("buffered", 8);
    const handled = ledger();
    const first = gate();
    const lost: unknown[] = [];
    // A fetches once: an expired row could otherwise go back to A itself, not to the competitor. Renewed
    // every 300 ms for 3 s: a renewal may come well over a second late on a busy machine and be in time.
    const a = await workers.start({
      ...fetchOnce,
      concurrency: 1,
      batchSize: 10,
      leaseTtlMs: 3000,
      heartbeatMs: 300,
      queues: {
        warm: () => {},
        buffered: async (_p, m) => {
          handled.add(m.id, "a");
          await first.opened;
        },
      },
    });
    a.on("lease_lost", (e) => lost.push(e));
    // How many rows A queues behind the running one follows its fetch round trip over the warm handler's
    // time (a busy machine queues fewer): at least one waiting is what this test needs.
    // Counted in the table, not by a.held: that also counts the warm row until its ack lands.
    const leasedByA = async () =>
      (
        await db.pool.query<{ id: string }>(
          `SELECT id::text FROM ${db.names.messages} WHERE acquired_by = $1 AND queue = 'buffered'`,
          [a.id],
        )
      ).rows.map((r) => r.id);
    let heldByA: string[] = [];
    await until(async () => {
      heldByA = await leasedByA();
      return handled.entries.length === 1 && heldByA.length >= 2;
    }, "one row running, more in A's queue");

    // A probe that B can lease only once every lease A took has run past its TTL, had it not been renewed.
    await db.pool.query(
      `INSERT INTO ${db.names.messages} (queue, payload, available_at)
       SELECT 'probe', '{}', max(acquired_at) + interval '3100 milliseconds' FROM ${db.names.messages}`,
    );
    let probed = false;
    const b = await workers.start({
      leaseTtlMs: 3000,
      heartbeatMs: 300,
      queues: {
        buffered: (_p, m) => void handled.add(m.id, "b"),
        probe: () => {
          probed = true;
        },
      },
    });
    b.on("lease_lost", (e) => lost.push(e));
    // The fetch that leased the probe ran when A's unrenewed leases would have expired, and left A's rows.
    await until(() => probed, "B leases the probe, after A's original leases ran out");
    first.open();
    await until(async () => (await count("messages")) === 0, "every row acknowledged");

    // Rows A held (running or queued) were never B's; what A had not fetched B may take.
    expect(handled.by("b").filter((id) => heldByA.includes(id))).toEqual([]);
    expect(heldByA.filter((id) => !handled.by("a").includes(id))).toEqual([]);
    expect([...handled.by("a"), ...handled.by("b")].sort()).toEqual([...ids].sort());
    expect(lost).toEqual([]);
  });
});

describe("a holder whose lease was taken over writes nothing", () => {
  it("its PermanentError does not dead-letter the row: lease_lost (dead), and the new owner's ack lands", async () => {
    const [id] = await publish("taken", 1);
    const failA = gate();
    let aRunning = false;
    // Lease and heartbeat far longer than the test: only the test's back-dating ends A's lease.
    const a = await workers.start({
      ...fetchOnce,
      leaseTtlMs: 60_000,
      heartbeatMs: 30_000,
      queues: {
        taken: async () => {
          aRunning = true;
          await failA.opened;
          throw new PermanentError("refused, but too late: the lease is gone");
        },
      },
    });
    await until(() => aRunning, "A's handler is running");
    const outcome = firstOutcome(a);

    // A's lease runs out (as if A had stalled) and worker B leases the row.
    await db.pool.query(`UPDATE ${db.names.messages} SET lease_expires_at = now() - interval '1 second'`);
    const finishB = gate();
    let bRunning = false;
    const b = await workers.start({
      queues: {
        taken: async () => {
          bRunning = true;
          await finishB.opened;
        },
      },
    });
    await until(() => bRunning, "B leased the row and runs it");
    expect(await count("messages", "acquired_by = $1", [b.id])).toBe(1);

    failA.open();
    // A's delivery (the row's first) is the one that lost.
    expect(await outcome).toEqual({ event: "lease_lost", id, queue: "taken", deliveries: 1, phase: "dead" });
    expect(await count("dead_letters")).toBe(0);
    expect(await count("messages", "acquired_by = $1 AND acquired_token IS NOT NULL", [b.id])).toBe(1);

    const acked = nextEvent<{ id: string }>(b, "acked");
    finishB.open();
    expect((await acked).id).toBe(id);
    expect(await count("messages")).toBe(0);
    expect(await count("dead_letters")).toBe(0);
  });

  it("stop hands back only rows it still owns: a waiting row taken over meanwhile keeps its new owner", async () => {
    await publish("warm", 1);
    const ids = await publish("handback", 5);
    const handled = ledger();
    const running = gate();
    const a = await workers.start({
      ...fetchOnce,
      concurrency: 1,
      batchSize: 10,
      leaseTtlMs: 60_000,
      heartbeatMs: 30_000,
      queues: {
        warm: () => {},
        handback: async (_p, m) => {
          handled.add(m.id, "a");
          await running.opened;
        },
      },
    });
    await until(() => handled.entries.length === 1 && a.held === 5, "one row running, four in A's queue");
    // Two of the four waiting rows get another owner, as after their leases expired.
    const waiting = ids.filter((id) => id !== handled.entries[0]?.id);
    const taken = waiting.slice(0, 2);
    const { rows: before } = await db.pool.query(
      `UPDATE ${db.names.messages} SET acquired_token = gen_random_uuid(), acquired_by = 'new-owner'
       WHERE id = ANY($1::bigint[])
       RETURNING id::text, acquired_token::text AS token, deliveries_count`,
      [taken],
    );
    expect(before).toHaveLength(2);

    const lostOnRelease: { id: string; phase: string }[] = [];
    a.on("lease_lost", (e) => lostOnRelease.push({ id: e.id, phase: e.phase }));
    const released = nextEvent<{ count: number }>(a, "released");
    const stopping = a.stop({ timeoutMs: 5000 });
    const releasedCount = (await released).count;
    running.open();
    expect(releasedCount).toBe(2);
    expect(await stopping).toEqual({ drained: true, released: 2, abandoned: [] });
    // The two it could not hand back are reported as lost to their new owner, not as released.
    expect(lostOnRelease.sort((x, y) => Number(x.id) - Number(y.id))).toEqual(
      taken.map((id) => ({ id, phase: "release" })).sort((x, y) => Number(x.id) - Number(y.id)),
    );

    const { rows: after } = await db.pool.query(
      `SELECT id::text, acquired_token::text AS token, deliveries_count FROM ${db.names.messages}
       WHERE acquired_by = 'new-owner' ORDER BY id`,
    );
    expect(after).toEqual(before.sort((x, y) => Number(x.id) - Number(y.id)));
    // A's own two waiting rows are free for anyone, their delivery not counted; the running one was acked.
    expect(
      await count("messages", "acquired_token IS NULL AND deliveries_count = 0 AND id = ANY($1::bigint[])", [
        waiting.slice(2),
      ]),
    ).toBe(2);
    expect(await count("messages")).toBe(4);
  });
});
