import { beforeAll, beforeEach, describe, expect, it } from "vitest";
import { OutboxConfigError } from "../../src/contract/errors.js";
import { PermanentError } from "../../src/index.js";
import { createWorker } from "../../src/worker/worker.js";
import { testDatabase } from "../support/database.js";
import { killBatchesOf, publisherFor, until, workerFactory } from "../support/worker.js";

/**
 * leaseMode "transaction": a batch's rows are locked by the transaction that leased them, nothing is written
 * on them until their outcomes, and a guard row per batch lets a crash be counted (DESIGN §2, issue 30).
 */

const db = testDatabase("txlease");
const workers = workerFactory(db);
const outbox = publisherFor(db.schema);
const m = db.names.messages;
const guards = `${db.names.quotedSchema}.lease_guards`;

beforeAll(() => db.migrate());
beforeEach(async () => {
  await db.pool.query(`TRUNCATE ${m}, ${db.names.deadLetters}, ${guards}`);
});

async function publish(queue: string, n: number, key?: (i: number) => string): Promise<string[]> {
  return db.inTransaction((c) =>
    outbox.publishMany(
      c,
      queue,
      Array.from({ length: n }, (_, i) => ({ payload: { i }, ...(key ? { key: key(i) } : {}) })),
    ),
  );
}

const scalar = async (sql: string, params: unknown[] = []) =>
  (await db.pool.query(sql, params)).rows[0]?.n as number;

/** A promise the test resolves when it chooses. */
function gate() {
  let open!: () => void;
  const opened = new Promise<void>((resolve) => {
    open = resolve;
  });
  return { open, opened };
}

const mode = { leaseMode: "transaction" } as const;

describe("leaseMode transaction", () => {
  it("delivers every row once and deletes it, writing no lease on the row and leaving no guard", async () => {
    const ids = await publish("q", 300);
    const seen: string[] = [];
    const leasedWhileRunning: number[] = [];
    await workers.start({
      ...mode,
      concurrency: 4,
      queues: {
        q: async (_p, msg) => {
          if (seen.length % 50 === 0) {
            // No token, no expiry: the row is held by its batch's row lock alone.
            leasedWhileRunning.push(
              await scalar(`SELECT count(*)::int AS n FROM ${m} WHERE acquired_token IS NOT NULL`),
            );
          }
          seen.push(msg.id);
        },
      },
    });
    await until(async () => (await scalar(`SELECT count(*)::int AS n FROM ${m}`)) === 0, "every row acked");
    expect(new Set(seen)).toEqual(new Set(ids));
    expect(seen).toHaveLength(ids.length);
    expect(leasedWhileRunning.every((n) => n === 0)).toBe(true);
    await until(
      async () => (await scalar(`SELECT count(*)::int AS n FROM ${guards}`)) === 0,
      "no guard left",
    );
  });

  it("a row in a running batch is skipped by other workers (token or transaction mode), and counted as delivered once", async () => {
    const [id] = await publish("q", 1);
    const release = gate();
    const started = gate();
    const deliveries: number[] = [];
    // One fetch at start, the next a minute later: the newer rows below are left to the other workers.
    await workers.start({
      ...mode,
      listen: false,
      minPollIntervalMs: 60_000,
      maxPollIntervalMs: 60_000,
      queues: {
        q: async (_p, msg) => {
          deliveries.push(msg.deliveries);
          started.open();
          await release.opened;
        },
      },
    });
    await started.opened;
    // The guard names the row while its batch runs.
    expect(await scalar(`SELECT count(*)::int AS n FROM ${guards} WHERE $1::bigint = ANY (ids)`, [id])).toBe(
      1,
    );
    // Two more rows, newer than the locked one: each competitor's fetch takes the oldest ready row first,
    // so by the time both are handled, every competitor has stepped over the locked row at least once.
    const newer = await publish("q", 2);
    const others: string[] = [];
    await workers.start({ queues: { q: (_p, msg) => void others.push(msg.id) } });
    await workers.start({ ...mode, queues: { q: (_p, msg) => void others.push(msg.id) } });
    await until(() => others.length >= 2, "the newer rows handled by the other workers");
    expect(new Set(others)).toEqual(new Set(newer));
    release.open();
    await until(async () => (await scalar(`SELECT count(*)::int AS n FROM ${m}`)) === 0, "the row acked");
    expect(deliveries).toEqual([1]);
    expect(others).not.toContain(id);
  });

  it("a failure is retried with the delivery and attempt counted, then dead-lettered with its reason", async () => {
    const [id] = await publish("q", 1);
    const seen: { deliveries: number; attempts: number }[] = [];
    await workers.start({
      ...mode,
      maxAttempts: 3,
      retry: () => 1,
      queues: {
        q: async (_p, msg) => {
          seen.push({ deliveries: msg.deliveries, attempts: msg.attempts });
          throw new Error(`boom ${seen.length}`);
        },
      },
    });
    await until(
      async () => (await scalar(`SELECT count(*)::int AS n FROM ${db.names.deadLetters}`)) === 1,
      "dead-lettered",
    );
    expect(seen).toEqual([
      { deliveries: 1, attempts: 0 },
      { deliveries: 2, attempts: 1 },
      { deliveries: 3, attempts: 2 },
    ]);
    const dead = (await db.pool.query(`SELECT * FROM ${db.names.deadLetters} WHERE id = $1`, [id])).rows[0];
    expect(dead.reason).toBe("retries_exhausted");
    expect(dead.error).toContain("boom 3");
    expect(dead.deliveries_count).toBe(3);
  });

  it("a permanent error goes straight to the dead letters", async () => {
    await publish("q", 2);
    await workers.start({
      ...mode,
      queues: {
        q: async () => {
          throw new PermanentError("no");
        },
      },
    });
    await until(
      async () => (await scalar(`SELECT count(*)::int AS n FROM ${db.names.deadLetters}`)) === 2,
      "both dead-lettered",
    );
    expect(await scalar(`SELECT count(*)::int AS n FROM ${m}`)).toBe(0);
  });

  it("a batch whose connection dies mid-handler is rolled back, counted by the guard's repair, and delivered again", async () => {
    const [id] = await publish("q", 1);
    const killed = gate();
    const deliveries: number[] = [];
    const workerId = `txkill-${Date.now()}`;
    await workers.start({
      ...mode,
      workerId,
      leaseTtlMs: 2000,
      queues: {
        q: async (_p, msg) => {
          deliveries.push(msg.deliveries);
          if (deliveries.length === 1) {
            // The batch's own transaction, killed under its handler.
            await killBatchesOf(db.pool, workerId);
            killed.open();
          }
        },
      },
    });
    await killed.opened;
    await until(
      async () => (await scalar(`SELECT count(*)::int AS n FROM ${m}`)) === 0,
      "delivered again",
      60_000,
    );
    // The crashed delivery was counted before the second one began: 1, then 2 (not 1 twice).
    expect(deliveries).toEqual([1, 2]);
    expect(id).toBeDefined();
    expect(await scalar(`SELECT count(*)::int AS n FROM ${guards}`)).toBe(0);
  });

  /**
   * Payloads of `chars` characters on queue "big": hex (stored as it is: compression cannot save a quarter
   * of it) or one repeated letter (stored compressed, a hundredth of its text).
   */
  async function big(n: number, chars: number, kind: "hex" | "repeated", first = false): Promise<void> {
    const text =
      kind === "hex"
        ? `(SELECT string_agg(md5(random()::text || i || j), '') FROM generate_series(1, ${chars / 32}) AS j)`
        : `repeat('x', ${chars})`;
    await db.pool.query(
      `INSERT INTO ${m} (queue, payload) SELECT 'big', jsonb_build_object('s', ${text}, 'first', $1::boolean)
       FROM generate_series(1, $2) AS i`,
      [first, n],
    );
  }

  /** A worker on "big" whose handlers block until released, but for the first rows (they teach it the size). */
  async function blockingBigWorker(maxHeldBytes: number) {
    const release = gate();
    const state = { started: 0 };
    await workers.start({
      ...mode,
      maxHeldBytes,
      concurrency: 40,
      batchSize: 40,
      queues: {
        big: async (payload) => {
          if ((payload as { first: boolean }).first) return;
          state.started++;
          await release.opened;
        },
      },
    });
    await until(
      async () => (await scalar(`SELECT count(*)::int AS n FROM ${m}`)) === 0,
      "the first rows acked",
    );
    return { release, state };
  }

  const heldNow = () => scalar(`SELECT count(*)::int AS n FROM ${db.names.batchLeased}`);
  const heldText = () =>
    scalar(
      `SELECT COALESCE(sum(octet_length(t.payload::text)), 0)::int AS n FROM ${db.names.batchLeased} AS b JOIN ${m} AS t ON t.id = b.id`,
    );
  /** Rows no transaction holds: what another worker could take now. */
  const lockable = () =>
    db.inTransaction(async (c) => {
      const { rows } = await c.query(
        `SELECT count(*)::int AS n FROM (SELECT id FROM ${m} FOR UPDATE SKIP LOCKED) AS free`,
      );
      return rows[0].n as number;
    }, true);
  const liveBatches = () =>
    scalar(`SELECT count(*)::int AS n FROM ${guards} WHERE pg_xact_status(xid) = 'in progress'`);

  it("sizes its batches by the rows it saw: two batches hold at most maxHeldBytes, and lock no row they do not take", async () => {
    await big(1, 8000, "hex", true);
    // The least the option takes: 8 rows of this size, 4 a batch.
    const maxHeldBytes = 65_536;
    const { release, state } = await blockingBigWorker(maxHeldBytes);
    await big(40, 8000, "hex");
    try {
      // Both batches in flight (no third is fetched), every handler of them blocked: what the worker holds
      // and locks now is all it will.
      await until(async () => (await liveBatches()) === 2, "two batches held");
      await until(async () => state.started === (await heldNow()), "every held row started");
      expect(await heldText()).toBeLessThanOrEqual(maxHeldBytes);
      expect(state.started).toBeGreaterThan(2);
      // Rows a batch's scan locked but did not take would stay locked, out of every other worker's reach.
      expect(await lockable()).toBe(40 - state.started);
    } finally {
      release.open();
    }
    await until(async () => (await scalar(`SELECT count(*)::int AS n FROM ${m}`)) === 0, "every row acked");
  });

  it("locks no row it does not take when several queues share a batch", async () => {
    for (const q of ["qa", "qb", "qc"]) await publish(q, 20);
    const release = gate();
    const state = { started: 0 };
    const handler = async () => {
      state.started++;
      await release.opened;
    };
    // Each queue's scan may lock up to the whole batch (10): the batch takes 10 of the 30 it locked.
    await workers.start({
      ...mode,
      concurrency: 40,
      batchSize: 10,
      queues: { qa: handler, qb: handler, qc: handler },
    });
    try {
      await until(async () => (await liveBatches()) === 2, "two batches held");
      await until(async () => state.started === (await heldNow()), "every held row started");
      expect(await heldNow()).toBe(20);
      expect(await lockable()).toBe(40);
    } finally {
      release.open();
    }
    await until(async () => (await scalar(`SELECT count(*)::int AS n FROM ${m}`)) === 0, "every row acked");
  });

  it("counts payload text against maxHeldBytes, not the compressed size the statement reads", async () => {
    await big(1, 50_000, "repeated", true);
    const maxHeldBytes = 65_536;
    const { release, state } = await blockingBigWorker(maxHeldBytes);
    // 40 rows of 50 kB text, 40 × ~600 B stored: the statement's cut alone would take them all.
    await big(40, 50_000, "repeated");
    try {
      await until(async () => state.started > 0 && state.started === (await heldNow()), "a batch running");
      // One row over half the budget: the batch takes it alone, and no second batch fits beside it.
      expect(await heldNow()).toBe(1);
      expect(await heldText()).toBeLessThanOrEqual(maxHeldBytes);
    } finally {
      release.open();
    }
    await until(async () => (await scalar(`SELECT count(*)::int AS n FROM ${m}`)) === 0, "every row acked");
  });

  it("a batch's follow-ups wake the workers of their queue at its commit, not at their next poll", async () => {
    await publish("parent", 3);
    // Its first poll takes this one: after it, the next poll is a minute away.
    await db.pool.query(`INSERT INTO ${m} (queue, payload) VALUES ('child', '{"i": -1}')`);
    const got: number[] = [];
    // Polls once at start, then only when woken: without a wake-up its rows would wait a minute.
    await workers.start({
      listen: true,
      minPollIntervalMs: 60_000,
      maxPollIntervalMs: 60_000,
      queues: {
        child: (p) => {
          got.push((p as { i: number }).i);
        },
      },
    });
    await until(() => got.includes(-1), "the first poll done");
    await workers.start({
      ...mode,
      queues: {
        parent: (p, msg) => {
          msg.publish("child", { i: (p as { i: number }).i });
        },
      },
    });
    await until(() => got.length === 4, "the follow-ups delivered by the woken worker");
    expect(got.sort()).toEqual([-1, 0, 1, 2]);
  });

  it("refuses queues whose handler runs in its own transaction or keeps an inbox", () => {
    for (const field of ["transaction", "inbox"] as const) {
      expect(() =>
        createWorker({
          connection: db.url,
          schema: db.schema,
          logger: false,
          ...mode,
          queues: { q: { handler: () => {}, [field]: true } },
        }),
      ).toThrow(OutboxConfigError);
    }
  });
});
