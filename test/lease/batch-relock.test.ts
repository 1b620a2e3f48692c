import { randomUUID } from "node:crypto";
import type pg from "pg";
import { afterEach, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { type BatchLeaser, createBatchLeaser, type HeldBatch } from "../../src/lease/pg-batch.js";
import { testDatabase } from "../support/database.js";
import { publisherFor } from "../support/worker.js";

/**
 * A transaction-held batch whose scans locked rows its cut left out rolls back to its savepoint and locks
 * again only the rows it took, each only if it is still the version it read (src/lease/pg-batch.ts,
 * keepTaken). Between the rollback and the re-lock every lock is gone: another worker can lease a taken row
 * and commit. That row must leave the batch, or two workers would hold it at once.
 */

const db = testDatabase("relock");
const outbox = publisherFor(db.schema);
const m = db.names.messages;
const QUEUES = ["qa", "qb", "qc"];
const RELOCK = "ROLLBACK TO SAVEPOINT lease_pick;";

beforeAll(() => db.migrate());
beforeEach(async () => {
  await db.pool.query(`TRUNCATE ${m}, ${db.names.quotedSchema}.lease_guards`);
  for (const queue of QUEUES) {
    await db.inTransaction((c) =>
      outbox.publishMany(
        c,
        queue,
        Array.from({ length: 10 }, (_, i) => ({ payload: { i } })),
      ),
    );
  }
});

let held: HeldBatch | undefined;
afterEach(async () => {
  await held?.rollback();
  held = undefined;
});

/**
 * A leaser whose batch connection runs `between(takenIds)` after the savepoint's rollback and before the
 * re-lock (which the product sends as one round trip: the test splits it to place another worker there).
 */
function leaser(between: (taken: string[]) => Promise<void>): { leaser: BatchLeaser; relocks: () => number } {
  let relocks = 0;
  const pool = {
    // The guard row is written beside the batch, on a pooled connection of its own.
    query: (...args: unknown[]) => (db.pool.query as (...a: unknown[]) => unknown)(...args),
    connect: async () => {
      const client = await db.pool.connect();
      const query = client.query.bind(client) as (config: unknown) => Promise<pg.QueryResult>;
      (client as { query: unknown }).query = async (config: unknown) => {
        const text =
          typeof config === "object" && config !== null ? (config as { text?: string }).text : undefined;
        if (!text?.startsWith(RELOCK)) return query(config);
        relocks++;
        const rolledBack = await query(RELOCK);
        const ids = /unnest\('\{([\d,]+)\}'/.exec(text)?.[1]?.split(",") ?? [];
        await between(ids);
        return [rolledBack, await query({ ...(config as object), text: text.slice(RELOCK.length) })];
      };
      return client;
    },
  } as unknown as pg.Pool;
  return {
    relocks: () => relocks,
    leaser: createBatchLeaser({
      pool: () => pool,
      names: db.names,
      queues: QUEUES,
      unorderedQueues: [],
      workerId: "relock-test",
      maxErrorLength: 1000,
      synchronousCommit: true,
      preparedStatements: () => false,
      queryTimeoutMs: 30_000,
      idleTimeoutMs: 60_000,
      confirmedForMs: 45_000,
    }),
  };
}

/** Rows of the batch's queues no transaction holds (the lease statement's view: locked rows are skipped). */
async function lockable(): Promise<number> {
  const { rows } = await db.pool.query(
    `SELECT count(*)::int AS n FROM (SELECT id FROM ${m} FOR UPDATE SKIP LOCKED) AS l`,
  );
  return rows[0].n;
}

describe("a transaction-held batch's re-lock after its cut", () => {
  it("keeps every row it took when nothing changed them, and holds no other", async () => {
    const { leaser: l, relocks } = leaser(async () => {});
    held = await l.lease(10);
    expect(relocks()).toBe(1);
    expect(held?.rows).toHaveLength(10);
    expect(await lockable()).toBe(20);
  });

  it("drops a taken row another worker leased between the rollback and the re-lock", async () => {
    const token = randomUUID();
    let stolen: string | undefined;
    const { leaser: l, relocks } = leaser(async (taken) => {
      stolen = taken[0];
      // Another worker's token lease of the row, committed while this batch holds no lock on it.
      const { rowCount } = await db.pool.query(
        `UPDATE ${m} SET acquired_token = $2::uuid, acquired_by = 'other', acquired_at = now(),
           lease_expires_at = now() + interval '1 hour', deliveries_count = deliveries_count + 1
         WHERE id = $1::bigint`,
        [stolen, token],
      );
      expect(rowCount).toBe(1);
    });
    held = await l.lease(10);
    expect(relocks()).toBe(1);
    const ids = held?.rows.map((r) => r.id) ?? [];
    expect(stolen).toBeDefined();
    expect(ids).not.toContain(stolen);
    expect(ids).toHaveLength(9);
    // The other worker's lease is untouched, and the batch holds its 9 rows only.
    const { rows } = await db.pool.query(
      `SELECT acquired_token::text AS token FROM ${m} WHERE id = $1::bigint`,
      [stolen],
    );
    expect(rows[0].token).toBe(token);
    expect(await lockable()).toBe(21);
  });
});
