import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { PLAN_REFRESH_MS } from "../../src/lease/pg-session.js";
import { createPgLeaseStore } from "../../src/lease/pg-store.js";
import { testDatabase } from "../support/database.js";
import { until } from "../support/worker.js";

const db = testDatabase("planrefresh");
const m = db.names.messages;
// One connection: every named statement is prepared, and its plan cached, on that one session.
const pool = new pg.Pool({ connectionString: db.url, max: 1 });
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

beforeAll(() => db.migrate());
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

/** Sequential scans of the messages table so far, with the store's connection's counts flushed first. */
async function seqScans(): Promise<number> {
  await pool.query("SELECT pg_stat_force_next_flush()");
  const read = async () =>
    Number(
      (await db.pool.query("SELECT seq_scan FROM pg_stat_user_tables WHERE relid = $1::regclass", [m]))
        .rows[0].seq_scan,
    );
  // The flush lands when that statement's transaction ends: wait until two reads agree.
  let last = await read();
  await until(
    async () => {
      const now = await read();
      const same = now === last;
      last = now;
      return same;
    },
    "the scan counts to settle",
    10_000,
  );
  return last;
}

/**
 * Named statements keep the generic plan Postgres made in their first runs. Made on a near-empty table it is a
 * sequential scan, kept until an ANALYZE or VACUUM; a table that grows without them (autovacuum off or behind)
 * was then read whole by every lease and ack. Each connection drops its plans once per refresh period.
 */
describe("plan refresh", () => {
  it("leases and acks stop scanning the table once a period has passed since it grew", async () => {
    // Eight runs of each statement on a near-empty table: past the five after which Postgres may keep a
    // generic plan.
    for (let i = 0; i < 8; i++) await deliverOne();
    // Another queue's backlog makes the table large; no ANALYZE, so no plan is invalidated by it.
    await db.pool.query(
      `INSERT INTO ${m} (queue, payload) SELECT 'other', jsonb_build_object('n', g, 'note', repeat('x', 200))
       FROM generate_series(1, 30000) AS g`,
    );
    clock += PLAN_REFRESH_MS;
    const before = await seqScans();
    for (let i = 0; i < 8; i++) await deliverOne();
    expect((await seqScans()) - before).toBe(0);
  });
});
