import { beforeAll, beforeEach, describe, expect, it } from "vitest";
import { testDatabase } from "../support/database.js";
import { killBatchesOf, publisherFor, until, workerFactory } from "../support/worker.js";

/**
 * leaseMode "transaction" in its corners (issue 41): a batch whose rows wait long for a slot is not ended by
 * the server while its worker is healthy, and a batch whose connection does end early charges a delivery only
 * to the rows that ran in it, never to those that never started.
 */

const db = testDatabase("txcorner");
const workers = workerFactory(db);
const outbox = publisherFor(db.schema);
const m = db.names.messages;

beforeAll(() => db.migrate());
beforeEach(async () => {
  await db.pool.query(`TRUNCATE ${m}, ${db.names.deadLetters}, ${db.names.quotedSchema}.lease_guards`);
});

const publish = (n: number) =>
  db.inTransaction((c) =>
    outbox.publishMany(
      c,
      "q",
      Array.from({ length: n }, (_, i) => ({ payload: { i } })),
    ),
  );
const scalar = async (sql: string) => (await db.pool.query(sql)).rows[0]?.n as number;

describe("leaseMode transaction, in the corners", () => {
  it("a batch whose rows wait for slots longer than the lease TTL is kept alive: each message runs once", async () => {
    // One slot of 40 ms behind batches that grow to 100 rows: an 80-row batch lives 3.2 s and the next
    // one sits idle in its transaction all that time, past the lease TTL (2 s) and the handler timeout
    // (200 ms) alike.
    const ids = await publish(250);
    const runs = new Map<string, number>();
    const worker = await workers.start({
      leaseMode: "transaction",
      concurrency: 1,
      batchSize: 100,
      leaseTtlMs: 2000,
      maxDeliveries: 5,
      queues: {
        q: {
          timeoutMs: 200,
          handler: async (_p, msg) => {
            runs.set(msg.id, (runs.get(msg.id) ?? 0) + 1);
            await new Promise((resolve) => setTimeout(resolve, 40));
          },
        },
      },
    });
    const lost: string[] = [];
    worker.on("lease_lost", (e) => lost.push(`${e.id} ${e.phase}`));
    await until(async () => (await scalar(`SELECT count(*)::int AS n FROM ${m}`)) === 0, "drained", 120_000);
    // No batch was ended under the worker: none lost a row.
    expect(lost).toEqual([]);
    expect(await scalar(`SELECT count(*)::int AS n FROM ${db.names.deadLetters}`)).toBe(0);
    expect([...runs.values()].filter((n) => n > 1)).toEqual([]);
    expect(new Set(runs.keys())).toEqual(new Set(ids));
  });

  it("a batch whose connection ends early starts none of its queued rows, and charges a delivery only to the row that ran", async () => {
    const ids = await publish(10);
    const seen: { id: string; deliveries: number }[] = [];
    let release!: () => void;
    const gate = new Promise<void>((resolve) => {
      release = resolve;
    });
    const workerId = "txcorner-ended";
    const worker = await workers.start({
      leaseMode: "transaction",
      workerId,
      concurrency: 1,
      batchSize: 10,
      queues: {
        q: async (_p, msg) => {
          seen.push({ id: msg.id, deliveries: msg.deliveries });
          if (seen.length === 1) await gate;
        },
      },
    });
    await until(() => seen.length === 1, "the first handler runs");
    // Its batch's connection is killed while the first row runs and nine wait in the local queue; the
    // worker hears of it (the client's error) and drops the nine, each reported lost before it started.
    const dropped: string[] = [];
    worker.on("lease_lost", (e) => {
      if (e.phase === "start") dropped.push(e.id);
    });
    await until(async () => {
      if (dropped.length === 0) await killBatchesOf(db.pool, workerId);
      return dropped.length >= 9;
    }, "the nine queued rows dropped");
    expect(dropped).toHaveLength(9);
    release();
    await until(async () => (await scalar(`SELECT count(*)::int AS n FROM ${m}`)) === 0, "drained");

    const first = seen[0] as { id: string; deliveries: number };
    const runsOf = (id: string) => seen.filter((s) => s.id === id);
    // The row that ran while its batch ended is delivered again, that delivery counted (once, or twice when
    // a fetch racing the kill held it in a second batch that was killed too).
    const again = runsOf(first.id).map((s) => s.deliveries);
    expect(again).toHaveLength(2);
    expect(again[1]).toBeGreaterThan(first.deliveries);
    // The nine that never started: each runs once, as a first delivery.
    for (const id of ids.filter((x) => x !== first.id))
      expect({ id, runs: runsOf(id).map((s) => s.deliveries) }).toEqual({ id, runs: [first.deliveries] });
  });

  it("a handler that runs past the stop's timeout leaves its row held through a crash: leased again only alone", async () => {
    const [id] = await publish(1);
    let started!: () => void;
    const running = new Promise<void>((resolve) => {
      started = resolve;
    });
    let hang!: () => void;
    const hung = new Promise<void>((resolve) => {
      hang = resolve;
    });
    const worker = await workers.start({
      leaseMode: "transaction",
      workerId: "txcorner-stop",
      queues: {
        q: async () => {
          started();
          await hung; // ignores its signal: the stop gives up on it
        },
      },
    });
    await running;
    const result = await worker.stop({ timeoutMs: 100 });
    hang();
    expect(result).toMatchObject({ drained: false });
    // Counted, and an expired lease in the worker's name: no batch takes it, a lease of its own does.
    const { rows } = await db.pool.query(
      `SELECT deliveries_count, acquired_by, acquired_token IS NOT NULL AS leased, lease_expires_at <= now() AS expired
       FROM ${m} WHERE id = $1`,
      [id],
    );
    expect(rows).toEqual([
      { deliveries_count: 1, acquired_by: "txcorner-stop", leased: true, expired: true },
    ]);
  });
});
