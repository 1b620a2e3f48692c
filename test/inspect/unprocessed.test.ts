import { beforeAll, describe, expect, it } from "vitest";
import { queueStatus, workerLeases } from "../../src/inspect/status.js";
import { testDatabase } from "../support/database.js";
import { until, workerFactory } from "../support/worker.js";

const db = testDatabase("view");
const workers = workerFactory({ url: db.url, schema: db.schema });

beforeAll(() => db.migrate());

describe("the unprocessed view", () => {
  it("shows each row's state: ready, scheduled, leased, lease_expired", async () => {
    const m = db.names.messages;
    await db.pool.query(`
      INSERT INTO ${m} (queue, payload) VALUES ('v', '{"s":"ready"}');
      INSERT INTO ${m} (queue, payload, available_at) VALUES ('v', '{"s":"scheduled"}', now() + interval '1 hour');
      INSERT INTO ${m} (queue, payload, acquired_token, acquired_at, lease_expires_at, acquired_by, deliveries_count)
        VALUES ('v', '{"s":"leased"}', gen_random_uuid(), now(), now() + interval '30 seconds', 'w1', 1);
      INSERT INTO ${m} (queue, payload, acquired_token, acquired_at, lease_expires_at, acquired_by, deliveries_count,
                        created_at)
        VALUES ('v', '{"s":"lease_expired"}', gen_random_uuid(), now() - interval '2 minutes',
                now() - interval '1 minute', 'w2', 1, now() - interval '1 hour');`);
    const { rows } = await db.pool.query(
      `SELECT payload->>'s' AS expected, state, acquired_by, extract(epoch FROM age) AS age_s
       FROM ${db.names.unprocessed} ORDER BY id`,
    );
    for (const row of rows) expect(row.state).toBe(row.expected);
    expect(rows.map((r) => r.acquired_by)).toEqual([null, null, "w1", "w2"]);
    expect(Number(rows[3].age_s)).toBeGreaterThanOrEqual(3600);
  });

  it("shows a row behind an earlier message of its key as blocked, and status counts it", async () => {
    const m = db.names.messages;
    await db.pool.query(`
      INSERT INTO ${m} (queue, payload, key) VALUES ('k', '{"s":"ready"}', 'order-1');
      INSERT INTO ${m} (queue, payload, key) VALUES ('k', '{"s":"blocked"}', 'order-1');
      INSERT INTO ${m} (queue, payload, key, available_at)
        VALUES ('k', '{"s":"blocked"}', 'order-1', now() + interval '1 hour');`);
    const { rows } = await db.pool.query(
      `SELECT payload->>'s' AS expected, state FROM ${db.names.unprocessed} WHERE queue = 'k' ORDER BY id`,
    );
    expect(rows.map((r) => r.state)).toEqual(rows.map((r) => r.expected));
    const status = (await queueStatus(db.pool, db.schema)).find((q) => q.queue === "k");
    expect(status).toMatchObject({ ready: 1, blocked: 2, scheduled: 0 });
  });

  it('shows the rows of a transaction-held batch (leaseMode "transaction") as leased by its worker', async () => {
    const m = db.names.messages;
    await db.pool.query(
      `INSERT INTO ${m} (queue, payload) SELECT 'tx', jsonb_build_object('i', i) FROM generate_series(1, 3) AS i`,
    );
    let release = () => {};
    const holding = new Promise<void>((resolve) => {
      release = resolve;
    });
    let started = 0;
    const worker = await workers.start({
      queues: {
        tx: async () => {
          started++;
          await holding;
        },
      },
      leaseMode: "transaction",
      workerId: "batcher",
      concurrency: 1,
      batchSize: 3,
    });
    try {
      await until(() => started > 0, "the batch's first handler runs");
      // No lease on the rows: the batch's guard is what says they are held.
      const { rows } = await db.pool.query(
        `SELECT state, acquired_by, acquired_at IS NOT NULL AS since, lease_expires_at FROM ${db.names.unprocessed} WHERE queue = 'tx'`,
      );
      expect(rows).toEqual(
        Array.from({ length: 3 }, () => ({
          state: "leased",
          acquired_by: "batcher",
          since: true,
          lease_expires_at: null,
        })),
      );
      const status = (await queueStatus(db.pool, db.schema)).find((q) => q.queue === "tx");
      expect(status).toMatchObject({ ready: 0, leased: 3, expired: 0 });
      expect(status?.oldest_ready_age_s).toBeNull();
      expect((await workerLeases(db.pool, db.schema)).find((w) => w.worker === "batcher")).toMatchObject({
        held: 3,
        expired: 0,
      });
    } finally {
      const stopped = worker.stop({ timeoutMs: 5000 });
      release();
      await stopped;
    }
    // The batch ended (its handled rows acked, any unstarted ones handed back): none shows as held any more.
    const after = await db.pool.query(`SELECT state FROM ${db.names.unprocessed} WHERE queue = 'tx'`);
    expect(after.rows.filter((r) => r.state !== "ready")).toEqual([]);
    expect(after.rowCount).toBeLessThan(3);
    expect((await workerLeases(db.pool, db.schema)).find((w) => w.worker === "batcher")).toBeUndefined();
  });

  it("does not expose the lease token: a reader cannot act as the lease holder", async () => {
    const { fields } = await db.pool.query(`SELECT * FROM ${db.names.unprocessed} LIMIT 0`);
    expect(fields.map((f) => f.name)).not.toContain("acquired_token");
  });

  it("reads without locks: it is not blocked by a worker holding rows, and changes nothing", async () => {
    const holder = await db.pool.connect();
    const reader = await db.pool.connect();
    try {
      await holder.query("BEGIN");
      // A fetching worker's row locks, held as long as its transaction is open.
      await holder.query(`SELECT id FROM ${db.names.messages} FOR UPDATE`);
      await reader.query("BEGIN");
      await reader.query("SET LOCAL lock_timeout = '200ms'");
      const before = await reader.query(`SELECT id, xmin::text FROM ${db.names.messages} ORDER BY id`);
      const seen = await reader.query(`SELECT count(*)::int AS n FROM ${db.names.unprocessed}`);
      expect(seen.rows[0].n).toBe(before.rowCount);
      await reader.query("COMMIT");
      await holder.query("ROLLBACK");
      const after = await reader.query(`SELECT id, xmin::text FROM ${db.names.messages} ORDER BY id`);
      // Same row versions: reading bumped no counter and took no lease.
      expect(after.rows).toEqual(before.rows);
    } finally {
      holder.release();
      reader.release();
    }
  });
});
