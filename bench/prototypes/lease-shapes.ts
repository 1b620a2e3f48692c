/**
 * What one delivered message costs Postgres under different lease shapes, without a worker: WAL bytes
 * (split by resource manager and full-page images, via pg_walinspect), Postgres CPU, HOT updates, dead
 * tuples and rows/s, on the product's table (migrated), 50,000 rows of ~100-byte payloads.
 *
 * `connections` loops (1 unless set), each on its own connection; `depth` batches in flight per loop (lease batch i+depth before acking batch i, as the worker's
 * prefetch does), so the fetch walks past leased rows as it does in the product.
 *
 * Shapes:
 * - floor: one DELETE … RETURNING of 500 (the SQL ceiling).
 * - current: the product's fetch statement, then its fenced ack.
 * - hot-ffN: the lease columns out of every index (a ready index on `head` alone, leased rows filtered on
 *   the heap), fillfactor N; lease and fenced ack as the product.
 * - txheld: rows locked by the leasing transaction (FOR UPDATE SKIP LOCKED), one small guard row per batch
 *   committed beside it, deleted by the same transaction that locked them.
 *
 *   node --import tsx bench/prototypes/lease-shapes.ts --shape current --depth 2
 */
import { randomUUID } from "node:crypto";
import pg from "pg";
import { migrate } from "../../src/migrate/migrator.js";
import { completeStatements } from "../../src/sql/complete.js";
import { runQuery } from "../../src/sql/executor.js";
import { fetchStatement } from "../../src/sql/fetch.js";
import { outboxNames } from "../../src/sql/names.js";
import { arg, cpuMeter, DATABASE_URL, PAYLOAD_SQL } from "../lib.js";

const shape = arg("shape", "current");
const depth = Number(arg("depth", "2"));
const rows = Number(arg("rows", "50000"));
const batch = Number(arg("batch", "500"));
const workerId = "w".repeat(Number(arg("worker-id-length", "5")));
const connections = Number(arg("connections", "1"));
const schema = "bench_lease_shapes";
const names = outboxNames(schema);
const m = names.messages;
const admin = new pg.Client({ connectionString: DATABASE_URL });
await admin.connect();
await admin.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
await admin.query("CREATE EXTENSION IF NOT EXISTS pg_walinspect");
await migrate({ connection: DATABASE_URL, schema });

const hot = /^hot-ff(\d+)(-ctid)?$/.exec(shape);
if (hot) {
  await admin.query(`
    ALTER TABLE ${m} SET (fillfactor = ${hot[1]});
    DROP INDEX IF EXISTS ${schema}.messages_head_ready_idx;
    DROP INDEX IF EXISTS ${schema}.messages_waiting_idx;
    DROP INDEX IF EXISTS ${schema}.messages_leased_idx;
    CREATE INDEX IF NOT EXISTS messages_due_idx ON ${m} (queue, available_at, id) WHERE head;
    CREATE INDEX IF NOT EXISTS messages_due_waiting_idx ON ${m} (queue, available_at, id) WHERE NOT head;`);
}
if (shape === "txheld") {
  await admin.query(
    `CREATE TABLE ${schema}.attempts (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, ids bigint[] NOT NULL, xid xid8 NOT NULL, at timestamptz NOT NULL DEFAULT now())`,
  );
}
await admin.query(
  `INSERT INTO ${m} (queue, payload) SELECT 'bench', ${PAYLOAD_SQL} FROM generate_series(1, ${rows}) AS g`,
);
await admin.query(`VACUUM ANALYZE ${m}`);
await admin.query("CHECKPOINT");

async function session(): Promise<pg.Client> {
  const client = new pg.Client({ connectionString: DATABASE_URL });
  await client.connect();
  await client.query("SET synchronous_commit = off");
  return client;
}
// Each loop has its own connection (and, for txheld, its own guard connection), as a worker's pool would.
const loops = await Promise.all(
  Array.from({ length: connections }, async () => ({ c: await session(), guard: await session() })),
);

const fetch = fetchStatement(names, { synchronousCommit: false }, true);
const { ack } = completeStatements(names, { synchronousCommit: false });
const hotLeaseCtid = {
  name: "hot_lease_ctid",
  text: `UPDATE ${m} AS t SET acquired_token = $2::uuid, acquired_at = now(),
  lease_expires_at = now() + interval '60 s', acquired_by = $4, deliveries_count = t.deliveries_count + 1
WHERE t.ctid = ANY (ARRAY(
  SELECT ctid FROM ${m} WHERE queue = $1 AND head AND available_at <= now()
    AND (acquired_token IS NULL OR lease_expires_at <= now())
  ORDER BY available_at, id LIMIT $3 FOR UPDATE SKIP LOCKED))
RETURNING t.id::text AS id, t.payload::text AS payload`,
};
const hotLease = {
  name: "hot_lease",
  text: `UPDATE ${m} AS t SET acquired_token = $2::uuid, acquired_at = now(),
  lease_expires_at = now() + interval '60 s', acquired_by = $4, deliveries_count = t.deliveries_count + 1
WHERE t.id = ANY (ARRAY(
  SELECT id FROM ${m} WHERE queue = $1 AND head AND available_at <= now()
    AND (acquired_token IS NULL OR lease_expires_at <= now())
  ORDER BY available_at, id LIMIT $3 FOR UPDATE SKIP LOCKED))
RETURNING t.id::text AS id, t.payload::text AS payload`,
};
const floor = {
  name: "floor",
  text: `DELETE FROM ${m} WHERE id = ANY (ARRAY(
  SELECT id FROM ${m} WHERE queue = $1 AND acquired_token IS NULL AND head AND available_at <= now()
  ORDER BY available_at, id LIMIT $2 FOR UPDATE SKIP LOCKED))
RETURNING id, payload`,
};
const txSelect = {
  name: "tx_select",
  // Ordered by the column, not the text alias of the same name (that sorted the whole table).
  text: `SELECT m.id::text AS id, m.payload::text AS payload, pg_current_xact_id()::text AS xid FROM ${m} AS m
  WHERE m.queue = $1 AND m.acquired_token IS NULL AND m.head AND m.available_at <= now()
  ORDER BY m.available_at, m.id LIMIT $2 FOR UPDATE SKIP LOCKED`,
};

const lsn0 = (await admin.query<{ l: string }>("SELECT pg_current_wal_lsn()::text AS l")).rows[0]?.l;
const stat0 = (await admin.query(`SELECT * FROM pg_stat_user_tables WHERE relid = '${m}'::regclass`)).rows[0];
const cpu = cpuMeter();
const t0 = performance.now();
let done = 0;
let leaseMs = 0;
let leases = 0;
async function loop(c: pg.Client, guard: pg.Client): Promise<void> {
  const inFlight: { ids: string[]; token: string }[] = [];
  async function lease(): Promise<boolean> {
    const token = randomUUID();
    const s = performance.now();
    let got: { id: string }[];
    if (shape === "current") {
      got = await runQuery(
        c,
        fetch,
        { queues: ["bench"], limit: batch, token, leaseTtlMs: 60_000, workerId },
        { prepared: true },
      );
    } else {
      const q = hot?.[2] ? hotLeaseCtid : hotLease;
      got = (await c.query({ ...q, values: ["bench", token, batch, workerId] })).rows;
    }
    leaseMs += performance.now() - s;
    leases++;
    if (got.length === 0) return false;
    inFlight.push({ ids: got.map((r) => r.id), token });
    return true;
  }
  async function ackOldest(): Promise<void> {
    const b = inFlight.shift();
    if (!b) return;
    const [r] = await runQuery(c, ack, { ids: b.ids, tokens: b.ids.map(() => b.token) }, { prepared: true });
    if (r?.deleted !== b.ids.length) throw new Error(`ack deleted ${r?.deleted} of ${b.ids.length}`);
    done += b.ids.length;
  }

  if (shape === "floor") {
    for (;;) {
      const r = await c.query({ ...floor, values: ["bench", batch] });
      if (r.rows.length === 0) break;
      done += r.rows.length;
    }
  } else if (shape === "txheld") {
    for (;;) {
      await c.query("BEGIN");
      const r = await c.query({ ...txSelect, values: ["bench", batch] });
      if (r.rows.length === 0) {
        await c.query("COMMIT");
        break;
      }
      const ids = r.rows.map((x) => x.id);
      // The crash-loop guard: one row per batch naming its ids and the leasing transaction, committed
      // before the handlers run (a crash leaves it behind for the repair to count a delivery).
      const g = await guard.query({
        name: "guard",
        text: `INSERT INTO ${schema}.attempts (ids, xid) VALUES ($1::bigint[], $2::xid8) RETURNING id`,
        values: [ids, r.rows[0].xid],
      });
      await c.query({ name: "txdel", text: `DELETE FROM ${m} WHERE id = ANY ($1::bigint[])`, values: [ids] });
      await c.query({
        name: "txdelguard",
        text: `DELETE FROM ${schema}.attempts WHERE id = $1`,
        values: [g.rows[0].id],
      });
      await c.query("COMMIT");
      done += ids.length;
    }
  } else {
    for (;;) {
      while (inFlight.length < depth) if (!(await lease())) break;
      if (inFlight.length === 0) break;
      await ackOldest();
    }
  }
}
await Promise.all(loops.map((l) => loop(l.c, l.guard)));
const seconds = (performance.now() - t0) / 1000;
const used = cpu.stop();
const lsn1 = (await admin.query<{ l: string }>("SELECT pg_current_wal_lsn()::text AS l")).rows[0]?.l;
// The backends flush their table statistics when they end.
for (const l of loops) {
  await l.c.end();
  await l.guard.end();
}
await new Promise((r) => setTimeout(r, 1500));
// Asynchronous commits: pg_walinspect reads only WAL already flushed (the WAL writer does so within 200 ms).
while (!(await admin.query("SELECT pg_current_wal_flush_lsn() >= $1::pg_lsn AS ok", [lsn1])).rows[0].ok)
  await new Promise((r) => setTimeout(r, 50));
const stat1 = (await admin.query(`SELECT * FROM pg_stat_user_tables WHERE relid = '${m}'::regclass`)).rows[0];
const wal = await admin.query(
  `SELECT "resource_manager/record_type" AS rm, count, record_size, fpi_size, combined_size
   FROM pg_get_wal_stats($1, $2, true) WHERE count > 0 ORDER BY combined_size DESC`,
  [lsn0, lsn1],
);
const total = wal.rows.reduce((s, r) => s + Number(r.combined_size), 0);
const fpi = wal.rows.reduce((s, r) => s + Number(r.fpi_size), 0);
const per = (x: number) => (x / done).toFixed(1);
console.log(
  JSON.stringify({
    shape,
    depth,
    connections,
    done,
    rowsPerS: Math.round(done / seconds),
    walPerMsg: per(total),
    fpiPerMsg: per(fpi),
    byRm: Object.fromEntries(wal.rows.map((r) => [r.rm, per(Number(r.combined_size))])),
    pgCpuUsPerMsg: ((used.rest / done) * 1e6).toFixed(1),
    nodeCpuUsPerMsg: ((used.node / done) * 1e6).toFixed(1),
    hotUpd: Number(stat1.n_tup_hot_upd) - Number(stat0.n_tup_hot_upd),
    upd: Number(stat1.n_tup_upd) - Number(stat0.n_tup_upd),
    deadTup: Number(stat1.n_dead_tup),
    leaseMsAvg: leases ? (leaseMs / leases).toFixed(2) : undefined,
  }),
);
await admin.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
await admin.end();
