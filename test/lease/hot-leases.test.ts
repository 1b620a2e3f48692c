import { randomUUID } from "node:crypto";
import pg from "pg";
import { beforeAll, describe, expect, it } from "vitest";
import { describeTableHealth, tableHealth } from "../../src/inspect/table-health.js";
import { completeStatements } from "../../src/sql/complete.js";
import { runQuery } from "../../src/sql/executor.js";
import { fetchStatement } from "../../src/sql/fetch.js";
import { testDatabase } from "../support/database.js";
import { until } from "../support/worker.js";

const db = testDatabase("hotlease");
/** A Kubernetes pod name's length: the holder is written by every lease and makes the leased row larger. */
const WORKER_ID = "orders-outbox-worker-7d9f8c6b5d-x2x9k-replica-0001";
const ROWS = 3000;

type Updates = { updated: number; hot: number };

/**
 * Row updates of messages the session has counted and not yet reported: all of them, and the HOT ones.
 * Reported between transactions only, so a difference inside one transaction is that transaction's.
 */
async function pendingUpdates(client: pg.ClientBase): Promise<Updates> {
  const { rows } = await client.query(
    `SELECT pg_stat_get_xact_tuples_updated($1::regclass)::int AS updated,
            pg_stat_get_xact_tuples_hot_updated($1::regclass)::int AS hot`,
    [db.names.messages],
  );
  return rows[0];
}

/**
 * Waits until the versions the committed writes so far left dead can be pruned: no transaction anywhere on
 * the server is older than they are (a transaction of another test file, in any database, holds pruning
 * back, and then a second update of a row finds no room on its page and is not HOT).
 */
async function untilPrunable(): Promise<void> {
  const { rows } = await db.pool.query<{ x: string }>("SELECT pg_current_xact_id()::xid::text AS x");
  const x = rows[0]?.x;
  await until(
    async () =>
      (
        await db.pool.query(
          `SELECT count(*)::int AS n FROM pg_stat_activity WHERE pid <> pg_backend_pid()
             AND (age(backend_xid) >= age($1::xid) OR age(backend_xmin) >= age($1::xid))`,
          [x],
        )
      ).rows[0].n === 0,
    "no transaction older than the writes to prune",
    120_000,
  );
}

/** Runs `write` in a transaction on `client` → the row updates it made, and its result. */
async function counted<T>(client: pg.ClientBase, write: () => Promise<T>): Promise<[Updates, T]> {
  await client.query("BEGIN");
  try {
    const before = await pendingUpdates(client);
    const result = await write();
    const after = await pendingUpdates(client);
    await client.query("COMMIT");
    return [{ updated: after.updated - before.updated, hot: after.hot - before.hot }, result];
  } catch (error) {
    await client.query("ROLLBACK");
    throw error;
  }
}

/**
 * Leasing, renewing and releasing change no indexed column, and each page keeps room for a new version of
 * every row, so each of those writes is a HOT update: one new row version on its page, no index entry
 * (DESIGN: what a delivered message costs Postgres). Counted by Postgres itself, in the transaction.
 */
describe("leases are HOT updates", () => {
  beforeAll(async () => {
    await db.migrate();
    // Payloads of ~100 bytes, as most outbox messages; inserted after the migration, as any backlog is.
    await db.pool.query(
      `INSERT INTO ${db.names.messages} (queue, payload)
       SELECT 'q', jsonb_build_object('orderId', g, 'customer', 'customer-' || (g % 97), 'note', repeat('x', 48))
       FROM generate_series(1, ${ROWS}) AS g`,
    );
  });

  it("a fetch of 500 rows and their release write no index entry", async () => {
    const fetch = fetchStatement(db.names, { synchronousCommit: false }, true);
    const { release } = completeStatements(db.names, { synchronousCommit: false });
    // A session of its own, ended after: a session reports its statistics when it ends (the last test reads them).
    const client = new pg.Client({ connectionString: db.url });
    await client.connect();
    try {
      const token = randomUUID();
      const [leasing, leased] = await counted(client, () =>
        runQuery(client, fetch, {
          queues: ["q"],
          limit: 500,
          token,
          leaseTtlMs: 30_000,
          workerId: WORKER_ID,
        }),
      );
      expect(leased).toHaveLength(500);
      expect(leasing).toEqual({ updated: 500, hot: 500 });
      // In its own transaction, as a stopping worker sends it: the lease's old versions are dead by then,
      // and pruning gives their room back once no older transaction can see them.
      await untilPrunable();
      const ids = leased.map((r) => r.id);
      const tokens = ids.map(() => token);
      const [releasing, released] = await counted(client, () => runQuery(client, release, { ids, tokens }));
      expect(released).toHaveLength(500);
      expect(releasing).toEqual({ updated: 500, hot: 500 });
      // The drain below leases these rows a third time.
      await untilPrunable();
    } finally {
      await client.end();
    }
  });

  it("a drain leases every page's rows at once, and every lease stays HOT", async () => {
    // Batches of 500 over consecutive pages: each page's rows are all leased by one statement, so the
    // page must hold a leased copy of each (the fillfactor's job), before any old version can be pruned.
    const fetch = fetchStatement(db.names, { synchronousCommit: false }, true);
    const { ack } = completeStatements(db.names, { synchronousCommit: false });
    // A session of its own, ended after: a session reports its statistics when it ends (the last test reads them).
    const client = new pg.Client({ connectionString: db.url });
    await client.connect();
    let total = { updated: 0, hot: 0 };
    try {
      for (;;) {
        const token = randomUUID();
        const [counts, leased] = await counted(client, () =>
          runQuery(client, fetch, {
            queues: ["q"],
            limit: 500,
            token,
            leaseTtlMs: 30_000,
            workerId: WORKER_ID,
          }),
        );
        total = { updated: total.updated + counts.updated, hot: total.hot + counts.hot };
        if (leased.length === 0) break;
        const ids = leased.map((r) => r.id);
        const [done] = await runQuery(client, ack, { ids, tokens: ids.map(() => token) });
        expect(done?.deleted).toBe(ids.length);
      }
    } finally {
      await client.end();
    }
    expect(total.updated).toBe(ROWS);
    expect(total.hot).toBe(ROWS);
  });

  it("status tells how many of the table's updates were HOT", async () => {
    // The sessions report their counts between transactions (within seconds when idle).
    let health = await tableHealth(db.pool, db.schema);
    await until(async () => {
      health = await tableHealth(db.pool, db.schema);
      return (health?.updates ?? 0) >= ROWS + 500;
    }, "the drain's updates in the statistics");
    expect(health?.hot_updates).toBe(health?.updates);
    expect(describeTableHealth(health as NonNullable<typeof health>)).toMatch(
      /, 100 % of [\d,]+ updates HOT$/,
    );
    const some = { ...(health as NonNullable<typeof health>), updates: 2000, hot_updates: 1500 };
    expect(describeTableHealth(some)).toMatch(/, 75 % of 2,000 updates HOT$/);
  });
});
