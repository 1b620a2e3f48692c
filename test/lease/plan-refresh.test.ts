import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { PLAN_REFRESH_MS } from "../../src/lease/pg-session.js";
import { createPgLeaseStore } from "../../src/lease/pg-store.js";
import { completeStatements } from "../../src/sql/complete.js";
import type { Query } from "../../src/sql/executor.js";
import { fetchStatement } from "../../src/sql/fetch.js";
import { testDatabase } from "../support/database.js";

const db = testDatabase("planrefresh");
const m = db.names.messages;
// One connection: every named statement is prepared, and its plan cached, on that one session.
const onePool = () => new pg.Pool({ connectionString: db.url, max: 1 });
let pool = onePool();
let clock = 1_000_000;
const store = createPgLeaseStore({
  pool: () => pool,
  names: db.names,
  queues: ["q"],
  workerId: "w",
  leaseTtlMs: 30_000,
  maxErrorLength: 4000,
  synchronousCommit: false,
  preparedStatements: true,
  queryTimeoutMs: 10_000,
  now: () => clock,
});

beforeAll(async () => {
  await db.migrate();
  // The case the refresh is for: a table growing with no ANALYZE. An autovacuum's ANALYZE (on by default,
  // as in the embedded Postgres) between the growth and the check would invalidate the stale plan itself.
  await db.pool.query(`ALTER TABLE ${m} SET (autovacuum_enabled = false)`);
});
afterAll(() => pool.end());

/** One message of `q` published, leased and acked: a run of the lease and the ack statements. */
async function deliverOne(): Promise<void> {
  await db.pool.query(`INSERT INTO ${m} (queue, payload) VALUES ('q', '{"n": 1}')`);
  const lease = await store.lease(10);
  expect(lease.rows).toHaveLength(1);
  const row = lease.rows[0];
  if (!row) throw new Error("no row leased");
  const landed = await store.ack([{ held: { id: row.id, token: lease.token, key: null } }]);
  expect(landed.count).toBe(1);
}

const settings = { synchronousCommit: false };
const leaseSql = fetchStatement(db.names, settings, true);
const ackSql = completeStatements(db.names, settings).ack;

/** A value as an SQL literal of unknown type: the prepared statement's parameter types apply to it. */
function literal(value: unknown): string {
  if (value === null || value === undefined) return "NULL";
  if (Array.isArray(value))
    return pg.escapeLiteral(`{${value.map((v) => JSON.stringify(String(v))).join(",")}}`);
  return pg.escapeLiteral(String(value));
}

/**
 * The plan the store's connection would use now for a named statement, read with EXPLAIN EXECUTE on that
 * same (only) connection: the cached plan itself, not shared statistics other backends flush late.
 */
async function scansMessages<P>(query: Query<P, unknown>, params: P): Promise<boolean> {
  const args = query.values(params).map(literal).join(", ");
  const { rows } = await pool.query(`EXPLAIN (FORMAT JSON) EXECUTE ${query.statement.name}(${args})`);
  const nodes: { "Node Type"?: string; "Relation Name"?: string }[] = [];
  const walk = (node: Record<string, unknown>) => {
    nodes.push(node);
    for (const child of (node.Plans as Record<string, unknown>[] | undefined) ?? []) walk(child);
  };
  walk(rows[0]["QUERY PLAN"][0].Plan);
  return nodes.some((n) => n["Node Type"] === "Seq Scan" && n["Relation Name"] === "messages");
}

async function planScans(): Promise<{ lease: boolean; ack: boolean }> {
  return {
    lease: await scansMessages(leaseSql, {
      queues: ["q"],
      unorderedQueues: [],
      limit: 10,
      token: "00000000-0000-0000-0000-000000000000",
      leaseTtlMs: 30_000,
      workerId: "w",
      shares: [10],
    }),
    ack: await scansMessages(ackSql, { ids: "{1}", tokens: "{00000000-0000-0000-0000-000000000000}" }),
  };
}

/**
 * Named statements keep the generic plan Postgres made in their first runs. Made on a near-empty table it is a
 * sequential scan, kept until an ANALYZE or VACUUM; a table that grows without them (autovacuum off or behind)
 * was then read whole by every lease and ack. Each connection drops its plans once per refresh period.
 */
describe("plan refresh", () => {
  it("leases and acks stop scanning the table once a period has passed since it grew", async () => {
    // The hazard, reproduced first. A session can lose its cached plans for reasons of its own (other
    // sessions' catalog changes overflowing its invalidation queue, as many test files migrating at once
    // do): then it replans on the large table, and the stale plan is not there to see. Up to 5 tries.
    let stale = false;
    for (let attempt = 0; attempt < 5 && !stale; attempt++) {
      // A new session each try: a session's plan cache remembers the costs of its earlier plans (made on
      // the large table by the try before), and then no longer keeps the small table's generic plan.
      await pool.end();
      pool = onePool();
      // Emptied: the table's new file drops every plan made on it.
      await db.pool.query(`TRUNCATE ${m}`);
      // Eight runs of each statement on a near-empty table: past the five after which Postgres may keep a
      // generic plan.
      for (let i = 0; i < 8; i++) await deliverOne();
      // Another queue's backlog makes the table large; no ANALYZE, so no plan is invalidated by it.
      await db.pool.query(
        `INSERT INTO ${m} (queue, payload) SELECT 'other', jsonb_build_object('n', g, 'note', repeat('x', 200))
         FROM generate_series(1, 30000) AS g`,
      );
      // The ack's plan kept from the small table reads it whole: what a connection without the refresh keeps.
      stale = (await planScans()).ack;
    }
    expect(stale).toBe(true);
    clock += PLAN_REFRESH_MS;
    for (let i = 0; i < 8; i++) await deliverOne();
    expect(await planScans()).toEqual({ lease: false, ack: false });
  });
});
