/**
 * One measurement in its own process, spawned by bench/run.ts: `tsx bench/job.ts '<json spec>'`. Prints
 * one `BENCH_RESULT {json}` line. Each job works in its own fresh schema and drops it at the end.
 */
import { randomUUID } from "node:crypto";
import { readFileSync, writeFileSync } from "node:fs";
import pg from "pg";
import { completeStatements } from "../src/sql/complete.js";
import { runQuery, textArray } from "../src/sql/executor.js";
import { fetchStatement } from "../src/sql/fetch.js";
import { outboxNames } from "../src/sql/names.js";
import {
  cpuMeter,
  DATABASE_URL,
  instrumentQueries,
  median,
  PAYLOAD_SQL,
  percentile,
  RESULT_MARK,
  runJob,
  sampleRss,
  sleep,
  until,
} from "./lib.js";
import { graphilePeer } from "./peers/graphile.js";
import { outboxPeer, withoutKeyTrigger } from "./peers/outbox.js";
import type { Peer } from "./peers/peer.js";
import { QUEUE, vacuumSchema } from "./peers/peer.js";
import { pgbossPeer } from "./peers/pgboss.js";
import { type SqlVariant, sqlDrain } from "./peers/sql.js";
import { type PgCost, pgCostMeter } from "./pg-cost.js";

export type PeerName = "outbox" | "graphile" | "pgboss";

export type JobSpec =
  | {
      kind: "drain";
      peer: PeerName;
      concurrency: number;
      rows: number;
      tuning?: Record<string, number>;
      /** Rows over this many ordering keys, in each peer's per-key FIFO (see Peer.fill); keyless if unset. */
      keys?: number;
      /** Stop after this long even if rows are left (a peer too slow to drain them): the rate is of the rows handled. */
      maxSeconds?: number;
      /** A prototype applied to this project's schema around the fill (bench/prototypes/<variant>.sql). */
      variant?: "unleased-key-index";
    }
  | { kind: "sql"; variant: SqlVariant; connections: number; rows: number }
  | {
      kind: "latency";
      peer: PeerName;
      listen: boolean;
      rate: number;
      seconds: number;
      tuning?: Record<string, number>;
      /** Producer mode (see the peer); "default" unless set. */
      mode?: string;
    }
  | { kind: "producer"; peer: PeerName; mode: string; clients: number; seconds: number; batch?: number }
  | { kind: "scale"; sizes: number[]; concurrency: number; timed: number }
  | {
      kind: "hotKey";
      concurrency: number;
      /** Rows of the one hot key (0: the baseline, the other keys alone). */
      hotRows: number;
      keys: number;
      perKey: number;
      /** How long the hot key's progress is watched once the other keys are done. */
      hotSeconds: number;
      /**
       * The hot key's rows go to a queue no worker serves: the same table and indexes, no hot key to
       * drain (the control that tells the hot key's own cost from that of a bigger table).
       */
      parked?: boolean;
    }
  | { kind: "keyScale"; rows: number; keys: number; timed: number }
  | {
      kind: "steady";
      peer: PeerName;
      /** Messages a second, each in its own producer transaction, from `producers` connections (4). */
      rate: number;
      producers?: number;
      seconds: number;
      /** Server-wide autovacuum on for the run (ALTER SYSTEM, restored after); off: as the server has it. */
      autovacuum: boolean;
      /** Length of each sampled window. */
      windowSeconds: number;
    };

export interface DrainResult {
  rate: number;
  seconds: number;
  /** Statements per message between 10 % and 90 % of the backlog (steady state). */
  roundTrips: number;
  rssMb: number;
  /** This project only: statements timed client side (ms), and rows per lease. */
  leaseMs?: number;
  ackMs?: number;
  leases?: number;
  /** CPU ms per 1000 messages: the worker process and the rest of the machine (Postgres). */
  cpuNode: number;
  cpuRest: number;
  /** Keyed drains: handler starts that came before an earlier row of their key (per-key FIFO broken). */
  orderViolations?: number;
  /** Set when `maxSeconds` ended the drain first: the rows handled by then. */
  partial?: number;
  /** What the drain cost Postgres (see bench/pg-cost.ts). */
  cost?: PgCost;
}
/** One window of a steady run: sizes at its end, pickup latency of the messages committed in it. */
export interface SteadyWindow {
  endS: number;
  tableBytes: number;
  indexBytes: number;
  deadTuples: number;
  p50: number;
  p99: number;
}
export interface SteadyResult {
  messages: number;
  windows: SteadyWindow[];
  cost: PgCost;
  cpuNode: number;
  cpuRest: number;
  autovacuumRuns: number;
}
export interface LatencyResult {
  p50: number;
  p95: number;
  p99: number;
  max: number;
}
export interface ProducerResult {
  txPerSec: number;
  rowsPerSec: number;
  notificationsPerSec: number;
}
export interface PlanCheck {
  rows: number;
  statement: string;
  mode: "custom" | "generic";
  scans: string;
  ok: boolean;
  ms: number;
}
export interface ScaleResult {
  plans: PlanCheck[];
  /** Isolated statement times at the largest size (ms), per rows leased/deleted. */
  timedFetch: { limit: number; p50: number; p99: number }[];
  timedAck: { limit: number; p50: number; p99: number }[];
  /** The same statements timed inside the draining worker (client side, event-loop waits included). */
  workerFetch: { p50: number; p99: number };
  workerAck: { p50: number; p99: number };
  rssMaxMb: number;
  rssMedianMb: number;
  rssIdleMb: number;
  startRate: number;
  endRate: number;
  rate: number;
  roundTrips: number;
}

export interface HotKeyResult {
  /** The other keys' rows: from the first handler start until none is left in the table. */
  otherRate: number;
  otherSeconds: number;
  /** Hot-key rows handled while the other keys drained, per second of that drain. */
  hotRateMixed: number;
  /** Hot-key rows per second once the other keys are done (the hot key alone). */
  hotRateAlone: number;
  /** Median time from one hot-key handler start to the next, hot key alone. */
  hotGapMs: number;
  /** Lease statements per hot-key row, hot key alone (1: one fetch per row, more: empty polls). */
  leasesPerHotRow: number;
  /** Median client-side ms of the worker's statements (by label), hot key alone. */
  statementMs: Record<string, number>;
  orderViolations: number;
  plans: PlanCheck[];
}
export interface KeyScaleResult {
  plans: PlanCheck[];
  /** Isolated times (ms) per rows leased: the fetch, and the completion (keyed: the ack transaction). */
  timedFetch: { limit: number; p50: number; p99: number }[];
  timedAck: { limit: number; p50: number; p99: number }[];
}

function peerFor(name: PeerName, schema: string, notify = true, keyed = false): Peer {
  if (name === "outbox") return outboxPeer(schema);
  if (name === "graphile") return graphilePeer(schema);
  return pgbossPeer(schema, notify, keyed);
}

/** Counts handler starts that came before an earlier row of their key (keys: row n has key n % keys). */
function orderCheck(keys: number): { see(n: number): void; readonly violations: number } {
  // The highest orderId seen per key, in a typed array: the check runs in every handler call of the keyed
  // drain, and a Map cost it about 0.5 µs of worker CPU a message that the keyless drain does not pay.
  const last = new Float64Array(keys).fill(Number.NEGATIVE_INFINITY);
  let violations = 0;
  return {
    see(n) {
      const k = n % keys;
      if ((last[k] as number) > n) violations++;
      else last[k] = n;
    },
    get violations() {
      return violations;
    },
  };
}

const MB = 2 ** 20;

/**
 * A prototype's SQL for `schema`, split at its `-- after fill` line: what runs on the migrated, empty
 * schema, and what runs once the fill is in.
 */
function prototypeSql(variant: string, schema: string): [string, string] {
  const text = readFileSync(new URL(`./prototypes/${variant}.sql`, import.meta.url), "utf8").replaceAll(
    "{{schema}}",
    outboxNames(schema).quotedSchema,
  );
  const [before = "", after = ""] = text.split(/^-- after fill$/m);
  return [before, after];
}

/** `text` (one or more statements) on a connection of its own. */
async function runSql(text: string): Promise<void> {
  const client = new pg.Client({ connectionString: DATABASE_URL });
  await client.connect();
  try {
    await client.query(text);
  } finally {
    await client.end();
  }
}

/**
 * With BENCH_PERF_FIFO set to a `perf record --control fifo:…` control file, a drain turns the profiler on
 * for its own window only (not the fill):
 * `perf record -e cpu-clock -a -g -D -1 --control fifo:/tmp/ctl` beside the job.
 */
function profileWindow(command: "enable" | "disable"): void {
  const fifo = process.env.BENCH_PERF_FIFO;
  if (fifo) writeFileSync(fifo, `${command}\n`);
}

/**
 * With BENCH_INDEX_STATS set, a drain prints (to stderr) each index's scans and entries read, and the pages
 * of messages and its indexes it read, once the worker is gone: the statistics of its sessions are flushed
 * as they exit, so read until two reads agree.
 */
async function printIndexStats(schema: string): Promise<void> {
  if (!process.env.BENCH_INDEX_STATS) return;
  const client = new pg.Client({ connectionString: DATABASE_URL });
  await client.connect();
  try {
    const read = async () => {
      const { rows } = await client.query(
        `SELECT s.indexrelname AS index, s.idx_scan::int AS scans, s.idx_tup_read::int AS read,
                (io.idx_blks_hit + io.idx_blks_read)::int AS pages
         FROM pg_stat_user_indexes AS s JOIN pg_statio_user_indexes AS io USING (indexrelid)
         WHERE s.schemaname = $1 ORDER BY 1`,
        [schema],
      );
      // Shared-buffer page reads of messages and its indexes (hits and misses): the drain's work in pages.
      const pages = await client.query(
        `SELECT (heap_blks_hit + heap_blks_read)::int AS heap, (idx_blks_hit + idx_blks_read)::int AS indexes
         FROM pg_statio_user_tables WHERE schemaname = $1 AND relname = 'messages'`,
        [schema],
      );
      return JSON.stringify({ indexes: rows, pages: pages.rows[0] });
    };
    let last = "";
    await until(
      async () => {
        await client.query("SELECT pg_stat_clear_snapshot()");
        const now = await read();
        const settled = now === last;
        last = now;
        return settled;
      },
      10_000,
      200,
    );
    console.error(`index stats ${last}`);
  } finally {
    await client.end();
  }
}

async function drain(spec: Extract<JobSpec, { kind: "drain" }>): Promise<DrainResult> {
  const schema = `bench_drain_${spec.peer}${spec.keys ? "_keyed" : ""}`;
  const peer = peerFor(spec.peer, schema, true, !!spec.keys);
  await peer.setup();
  const [beforeFill, afterFill] = spec.variant ? prototypeSql(spec.variant, schema) : [];
  if (beforeFill) await runSql(beforeFill);
  await peer.fill(spec.rows, spec.keys);
  if (afterFill) await runSql(afterFill);
  const order = spec.keys ? orderCheck(spec.keys) : undefined;
  const queries = instrumentQueries();
  const lo = Math.floor(spec.rows * 0.1);
  const hi = Math.floor(spec.rows * 0.9);
  let handled = 0;
  let first = 0;
  let atLo = 0;
  let atHi = 0;
  const meter = await pgCostMeter(schema);
  const rss = sampleRss();
  const cpu = cpuMeter();
  profileWindow("enable");
  await peer.startWorker({
    concurrency: spec.concurrency,
    listen: true,
    ...(spec.tuning ? { tuning: spec.tuning } : {}),
    onJob: (p) => {
      if (handled === 0) first = performance.now();
      handled++;
      order?.see(p.orderId);
      if (handled === lo) atLo = queries.count;
      if (handled === hi) atHi = queries.count;
    },
  });
  const cap = (spec.maxSeconds ?? Number.POSITIVE_INFINITY) * 1000;
  await until(() => handled >= spec.rows || (handled > 0 && performance.now() - first > cap), 600_000, 1);
  const partial = handled < spec.rows;
  if (!partial) await until(async () => (await peer.remaining()) === 0, 60_000, 2);
  const seconds = (performance.now() - first) / 1000;
  const used = cpu.stop();
  await meter.endWal();
  profileWindow("disable");
  const rssMb = Math.max(...rss.stop()) / MB;
  await peer.stopWorker();
  const cost = await meter.stop();
  await printIndexStats(schema);
  await peer.teardown();
  if (handled !== spec.rows && !partial) throw new Error(`${handled} handler calls for ${spec.rows} rows`);
  const lease = queries.timings.get("lease");
  const ack = queries.timings.get("ack");
  return {
    rate: handled / seconds,
    seconds,
    roundTrips: handled >= hi ? (atHi - atLo) / (hi - lo) : Number.NaN,
    rssMb,
    cpuNode: (used.node * 1e6) / handled,
    cpuRest: (used.rest * 1e6) / handled,
    ...(lease && ack ? { leaseMs: median(lease), ackMs: median(ack), leases: lease.length } : {}),
    ...(order ? { orderViolations: order.violations } : {}),
    ...(partial ? { partial: handled } : {}),
    cost,
  };
}

async function sqlCeiling(spec: Extract<JobSpec, { kind: "sql" }>): Promise<DrainResult> {
  const schema = "bench_drain_sql";
  const peer = outboxPeer(schema);
  await peer.setup();
  await peer.fill(spec.rows);
  const queries = instrumentQueries();
  const before = queries.count;
  const meter = await pgCostMeter(schema);
  const cpu = cpuMeter();
  let leased = 0;
  const started = performance.now();
  await sqlDrain(schema, spec.variant, spec.connections, (n) => {
    leased += n;
  });
  const seconds = (performance.now() - started) / 1000;
  const statements = queries.count - before;
  const used = cpu.stop();
  const cost = await meter.stop();
  const left = await peer.remaining();
  await peer.teardown();
  if (left !== 0 || leased !== spec.rows) throw new Error(`sql drain: ${left} left, ${leased} leased`);
  return {
    rate: spec.rows / seconds,
    seconds,
    roundTrips: statements / spec.rows,
    rssMb: process.memoryUsage().rss / MB,
    cpuNode: (used.node * 1e6) / spec.rows,
    cpuRest: (used.rest * 1e6) / spec.rows,
    cost,
  };
}

async function latency(spec: Extract<JobSpec, { kind: "latency" }>): Promise<LatencyResult> {
  const peer = peerFor(spec.peer, `bench_latency_${spec.peer}`, spec.listen);
  await peer.setup();
  await runSql("CHECKPOINT");
  const started = new Map<number, number>();
  await peer.startWorker({
    concurrency: 10,
    listen: spec.listen,
    ...(spec.tuning ? { tuning: spec.tuning } : {}),
    onJob: (p) => {
      started.set(p.orderId, performance.now());
    },
  });
  await sleep(1000); // idle worker
  const producer = await peer.producer(4, spec.mode ?? "default");
  const total = Math.round(spec.rate * spec.seconds);
  const committed = new Map<number, number>();
  const inflight: Promise<void>[] = [];
  const t0 = performance.now();
  for (let i = 0; i < total; i++) {
    const wait = t0 + (i * 1000) / spec.rate - performance.now();
    if (wait > 0) await sleep(wait);
    inflight.push(producer.publish(i).then(() => void committed.set(i, performance.now())));
  }
  await Promise.all(inflight);
  await until(() => started.size >= total, 15_000, 5);
  await peer.stopWorker();
  await producer.close();
  await peer.teardown();
  // A handler can start before its producer has seen COMMIT return: that counts as 0.
  const lat = [...committed].map(([i, at]) => Math.max(0, (started.get(i) ?? Number.NaN) - at));
  return {
    p50: percentile(lat, 50),
    p95: percentile(lat, 95),
    p99: percentile(lat, 99),
    max: Math.max(...lat),
  };
}

/**
 * Steady traffic: producers commit `rate` single-message transactions a second for `seconds` while one
 * worker (default options, concurrency 10) takes them. Each window reports the schema's table and index
 * sizes and dead tuples at its end and the pickup latency (commit returned → handler start) of the
 * messages committed in it: what bloat does to the table and to pickup over time, autovacuum off or on.
 */
async function steady(spec: Extract<JobSpec, { kind: "steady" }>): Promise<SteadyResult> {
  const schema = `bench_steady_${spec.peer}`;
  const peer = peerFor(spec.peer, schema, true);
  await peer.setup();
  const admin = new pg.Client({ connectionString: DATABASE_URL, application_name: "bench-steady" });
  await admin.connect();
  const wasOn = (await admin.query("SHOW autovacuum")).rows[0].autovacuum === "on";
  const setAutovacuum = async (on: boolean) => {
    await admin.query(`ALTER SYSTEM SET autovacuum = ${on ? "on" : "off"}`);
    await admin.query("SELECT pg_reload_conf()");
  };
  if (spec.autovacuum !== wasOn) await setAutovacuum(spec.autovacuum);
  try {
    await admin.query("CHECKPOINT");
    const vacuums = async () =>
      Number(
        (
          await admin.query(
            "SELECT COALESCE(sum(autovacuum_count), 0)::int AS n FROM pg_stat_user_tables WHERE schemaname = $1",
            [schema],
          )
        ).rows[0].n,
      );
    const vacuums0 = await vacuums();
    const started = new Map<number, number>();
    const committed = new Map<number, number>();
    await peer.startWorker({
      concurrency: 10,
      listen: true,
      onJob: (p) => {
        started.set(p.orderId, performance.now());
      },
    });
    const meter = await pgCostMeter(schema);
    const cpu = cpuMeter();
    const producer = await peer.producer(spec.producers ?? 4, "default");
    const total = Math.round(spec.rate * spec.seconds);
    const windows: SteadyWindow[] = [];
    const inflight = new Set<Promise<void>>();
    const t0 = performance.now();
    let windowStart = 0;
    let nextWindow = t0 + spec.windowSeconds * 1000;
    for (let i = 0; i < total; i++) {
      const wait = t0 + (i * 1000) / spec.rate - performance.now();
      if (wait > 0) await sleep(wait);
      const p: Promise<void> = producer.publish(i).then(() => {
        committed.set(i, performance.now());
        inflight.delete(p);
      });
      inflight.add(p);
      if (performance.now() >= nextWindow || i === total - 1) {
        const windowEnd = i + 1;
        await Promise.all(inflight);
        await until(() => started.size >= windowEnd, 60_000, 5);
        const lat: number[] = [];
        for (let n = windowStart; n < windowEnd; n++)
          lat.push(Math.max(0, (started.get(n) ?? Number.NaN) - (committed.get(n) ?? Number.NaN)));
        const size = (
          await admin.query(
            `SELECT COALESCE(sum(pg_relation_size(relid)), 0)::float8 AS t, COALESCE(sum(pg_indexes_size(relid)), 0)::float8 AS i,
                    COALESCE(sum(n_dead_tup), 0)::float8 AS d
             FROM pg_stat_user_tables WHERE schemaname = $1`,
            [schema],
          )
        ).rows[0];
        windows.push({
          endS: (performance.now() - t0) / 1000,
          tableBytes: size.t,
          indexBytes: size.i,
          deadTuples: size.d,
          p50: percentile(lat, 50),
          p99: percentile(lat, 99),
        });
        windowStart = windowEnd;
        nextWindow += spec.windowSeconds * 1000;
      }
    }
    await until(async () => (await peer.remaining()) === 0, 60_000, 5);
    const used = cpu.stop();
    await meter.endWal();
    await peer.stopWorker();
    await producer.close();
    const cost = await meter.stop();
    const autovacuumRuns = (await vacuums()) - vacuums0;
    return {
      messages: total,
      windows,
      cost,
      cpuNode: (used.node * 1e6) / total,
      cpuRest: (used.rest * 1e6) / total,
      autovacuumRuns,
    };
  } finally {
    if (spec.autovacuum !== wasOn) await setAutovacuum(wasOn);
    await admin.end();
    await peer.teardown();
  }
}

async function producer(spec: Extract<JobSpec, { kind: "producer" }>): Promise<ProducerResult> {
  const schema = `bench_producer_${spec.peer}`;
  const peer = peerFor(spec.peer, schema, spec.mode !== "quiet");
  await peer.setup();
  await runSql("CHECKPOINT");
  // A worker-like LISTEN connection, so notifications are delivered as they would be in production.
  const listener = new pg.Client({ connectionString: DATABASE_URL });
  await listener.connect();
  let notifications = 0;
  listener.on("notification", () => notifications++);
  await listener.query(`LISTEN "${await peer.channel()}"`);
  const p = await peer.producer(spec.clients, spec.mode);
  let next = 0;
  let transactions = 0;
  const deadline = performance.now() + spec.seconds * 1000;
  await Promise.all(
    Array.from({ length: spec.clients }, async () => {
      while (performance.now() < deadline) {
        if (spec.batch) {
          const from = next;
          next += spec.batch;
          await p.publishBatch(from, spec.batch);
        } else {
          await p.publish(next++);
        }
        transactions++;
      }
    }),
  );
  await p.close();
  const rows = await peer.remaining();
  await listener.end();
  await peer.teardown();
  const expected = transactions * (spec.batch ?? 1);
  if (rows !== expected) throw new Error(`${rows} rows stored for ${expected} published`);
  return {
    txPerSec: transactions / spec.seconds,
    rowsPerSec: expected / spec.seconds,
    notificationsPerSec: notifications / spec.seconds,
  };
}

/** Names of the scans in a JSON plan, e.g. "Index Scan using messages_ready_idx". */
function scans(plan: Record<string, unknown>, out: string[] = []): string[] {
  const type = String(plan["Node Type"]);
  if (/Scan/.test(type) && type !== "Function Scan" && type !== "Subquery Scan" && type !== "CTE Scan") {
    out.push(
      plan["Index Name"] ? `${type} using ${plan["Index Name"]}` : `${type} on ${plan["Relation Name"]}`,
    );
  }
  for (const child of (plan.Plans as Record<string, unknown>[] | undefined) ?? []) scans(child, out);
  return out;
}

/**
 * EXPLAIN (ANALYZE) of the fetch and the ack as the worker prepares them, custom and generic plans. `keyed`:
 * only the fetch (the keyed ack and its promotion run inside the `ack_key_heads` function, see below).
 */
async function explainStatements(
  pool: pg.Pool,
  schema: string,
  rows: number,
  keyed = false,
): Promise<PlanCheck[]> {
  const names = outboxNames(schema);
  const fetchSql = fetchStatement(names, { synchronousCommit: false }, true).statement.text;
  const complete = completeStatements(names, { synchronousCommit: false });
  // The keyed ack and the promotion run inside the ack_key_heads function, whose plans EXPLAIN cannot show
  // (test/fetch/fetch-plan.test.ts reads them through auto_explain): keyed, only the fetch is explained here.
  const ackSql = complete.ack.statement.text;
  const checks: PlanCheck[] = [];
  const client = await pool.connect();
  try {
    await client.query(
      `PREPARE lease(text[], int, uuid, double precision, text, text[], bigint, uuid[], int[]) AS ${fetchSql}`,
    );
    await client.query(`PREPARE ack(bigint[], uuid[]) AS ${ackSql}`);

    for (const mode of ["custom", "generic"] as const) {
      await client.query(`SET plan_cache_mode = force_${mode}_plan`);
      await client.query("BEGIN");
      const token = randomUUID();
      const lease = await client.query(
        `EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE lease('{${QUEUE}}', 500, '${token}', 30000, 'explain', '{}', ${Number.MAX_SAFE_INTEGER}, '{}', '{500}')`,
      );
      const fetchPlan = lease.rows[0]["QUERY PLAN"][0];
      // Lease 500 more for real (in the same transaction) and explain deleting them, fenced by token.
      const leased = await runQuery(client, fetchStatement(names, { synchronousCommit: false }, true), {
        queues: [QUEUE],
        limit: 500,
        token,
        leaseTtlMs: 30000,
        workerId: "explain",
      });
      const ids = `{${leased.map((r) => r.id).join(",")}}`;
      const tokens = `{${leased.map(() => token).join(",")}}`;
      const explained: [string, Plan, string[]][] = [
        ["fetch", fetchPlan, ["messages_due_idx", "messages_pkey"]],
      ];
      if (!keyed) {
        const ack = await client.query(`EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE ack('${ids}', '${tokens}')`);
        explained.push(["ack", ack.rows[0]["QUERY PLAN"][0], []]);
      }
      await client.query("ROLLBACK");
      for (const [statement, plan, mustUse] of explained) {
        const found = scans(plan.Plan);
        const ok =
          !found.some((s) => / on messages$/.test(s) || /Seq Scan|Bitmap/.test(s)) &&
          mustUse.every((index) => found.some((s) => s.endsWith(index)));
        checks.push({
          rows,
          statement,
          mode,
          scans: [plan.Plan["Node Type"], ...new Set(found), ...(plan.JIT ? ["JIT compiled"] : [])].join(
            " · ",
          ),
          ok,
          ms: plan["Execution Time"],
        });
      }
    }
  } finally {
    await client.query("ROLLBACK").catch(() => {});
    await client.query("DEALLOCATE lease").catch(() => {});
    await client.query("DEALLOCATE ack").catch(() => {});
    await client.query("RESET plan_cache_mode").catch(() => {});
    client.release();
  }
  return checks;
}

type Plan = { Plan: Record<string, unknown>; "Execution Time": number; JIT?: unknown };

async function scale(spec: Extract<JobSpec, { kind: "scale" }>): Promise<ScaleResult> {
  const schema = "bench_scale";
  const names = outboxNames(schema);
  const peer = outboxPeer(schema);
  const pool = new pg.Pool({ connectionString: DATABASE_URL, max: 2 });
  await peer.setup();
  const insert = async (from: number, to: number) => {
    // In slices, so no single transaction holds a million new rows.
    for (let a = from; a <= to; a += 250_000) {
      await pool.query(
        `INSERT INTO ${names.messages} (queue, payload)
         SELECT '${QUEUE}', ${PAYLOAD_SQL} FROM generate_series($1::int, $2::int) AS g`,
        [a, Math.min(to, a + 249_999)],
      );
    }
  };
  const plans: PlanCheck[] = [];
  let size = 0;
  for (const target of spec.sizes) {
    await insert(size + 1, target);
    size = target;
    await vacuumSchema(pool, schema);
    plans.push(...(await explainStatements(pool, schema, size)));
  }

  // The statements alone, on the full backlog: lease N, delete them fenced, `timed` times per N.
  const fetch = fetchStatement(names, { synchronousCommit: false }, true);
  const { ack } = completeStatements(names, { synchronousCommit: false });
  const timedFetch: ScaleResult["timedFetch"] = [];
  const timedAck: ScaleResult["timedAck"] = [];
  const client = await pool.connect();
  let taken = 0;
  for (const limit of [100, 500]) {
    const fetchMs: number[] = [];
    const ackMs: number[] = [];
    for (let i = 0; i < spec.timed; i++) {
      const token = randomUUID();
      let t = performance.now();
      const rows = await runQuery(
        client,
        fetch,
        { queues: [QUEUE], limit, token, leaseTtlMs: 30000, workerId: "timing" },
        { prepared: true },
      );
      fetchMs.push(performance.now() - t);
      const ids = rows.map((r) => r.id);
      t = performance.now();
      await runQuery(client, ack, { ids, tokens: ids.map(() => token) }, { prepared: true });
      ackMs.push(performance.now() - t);
      taken += ids.length;
    }
    timedFetch.push({ limit, p50: percentile(fetchMs, 50), p99: percentile(fetchMs, 99) });
    timedAck.push({ limit, p50: percentile(ackMs, 50), p99: percentile(ackMs, 99) });
  }
  client.release();
  // Top the backlog up again, then drain it with one worker.
  await insert(size + 1, size + taken);
  await vacuumSchema(pool, schema);
  const rows = (await pool.query(`SELECT count(*)::int AS n FROM ${names.messages}`)).rows[0].n as number;

  await pool.end();
  // The drain itself: the compiled package under plain node (see drain-compiled.mjs).
  const drained = await runJob<Omit<ScaleResult, "plans" | "timedFetch" | "timedAck">>(
    { url: DATABASE_URL, schema, rows, concurrency: spec.concurrency },
    { script: "bench/drain-compiled.mjs" },
  );
  await peer.teardown();
  return { plans, timedFetch, timedAck, ...drained };
}

/** Heads and rows of a freshly filled schema: a fill that set `head` wrong would measure nothing real. */
async function checkHeads(pool: pg.Pool, schema: string, rows: number, heads: number): Promise<void> {
  const { rows: r } = await pool.query(
    `SELECT count(*)::int AS n, count(*) FILTER (WHERE head)::int AS heads FROM ${outboxNames(schema).messages}`,
  );
  if (r[0].n !== rows || r[0].heads !== heads) {
    throw new Error(`fill: ${r[0].n} rows with ${r[0].heads} heads, expected ${rows} with ${heads}`);
  }
}

/**
 * One hot key holding `hotRows` rows among `keys` × `perKey` rows of other keys (interleaved in id order),
 * one worker with default options: how fast the other keys drain, and how the hot key proceeds meanwhile
 * and alone. The hot rows carry negative orderIds (-1, -2, … in id order), the others n with key n % keys.
 */
async function hotKey(spec: Extract<JobSpec, { kind: "hotKey" }>): Promise<HotKeyResult> {
  const schema = "bench_hot";
  const m = outboxNames(schema).messages;
  const peer = outboxPeer(schema);
  const pool = new pg.Pool({ connectionString: DATABASE_URL, max: 2 });
  await peer.setup();
  const others = spec.keys * spec.perKey;
  const parts = [
    `SELECT '${QUEUE}', g, 'k' || (g % ${spec.keys}), g <= ${spec.keys}, g::float8 / ${others} FROM generate_series(1, ${others}) AS g`,
  ];
  const hotQueue = spec.parked ? `${QUEUE}.parked` : QUEUE;
  if (spec.hotRows > 0) {
    parts.push(
      `SELECT '${hotQueue}', -g, 'hot', g = 1, g::float8 / ${spec.hotRows} FROM generate_series(1, ${spec.hotRows}) AS g`,
    );
  }
  await withoutKeyTrigger(
    pool,
    schema,
    `INSERT INTO ${m} (queue, payload, key, head)
     SELECT s.queue, ${PAYLOAD_SQL}, s.key, s.head FROM (${parts.join(" UNION ALL ")}) AS s(queue, g, key, head, pos)
     ORDER BY s.pos, s.g`,
  );
  await checkHeads(pool, schema, others + spec.hotRows, spec.keys + (spec.hotRows > 0 ? 1 : 0));
  await vacuumSchema(pool, schema);
  const plans = await explainStatements(pool, schema, others + spec.hotRows, true);

  const queries = instrumentQueries();
  const order = orderCheck(spec.keys);
  let first = 0;
  let other = 0;
  let hot = 0;
  let lastHot = 0;
  let hotViolations = 0;
  const hotStarts: number[] = [];
  await peer.startWorker({
    concurrency: spec.concurrency,
    listen: true,
    onJob: (p) => {
      const now = performance.now();
      if (first === 0) first = now;
      if (p.orderId < 0) {
        hot++;
        if (-p.orderId !== lastHot + 1) hotViolations++;
        lastHot = -p.orderId;
        hotStarts.push(now);
      } else {
        other++;
        order.see(p.orderId);
      }
    },
  });
  await until(() => other >= others, Number(process.env.BENCH_UNTIL_MS ?? 600_000), 1).catch((e) => {
    throw new Error(`${e}: ${other} of ${others} other-key rows, ${hot} hot rows handled`);
  });
  await until(
    async () => (await pool.query(`SELECT count(*)::int AS n FROM ${m} WHERE key <> 'hot'`)).rows[0].n === 0,
    60_000,
    2,
  );
  const otherSeconds = (performance.now() - first) / 1000;
  const hotMixed = hot;
  let hotRateAlone = Number.NaN;
  let hotGapMs = Number.NaN;
  let leasesPerHotRow = Number.NaN;
  const statementMs: Record<string, number> = {};
  if (spec.hotRows > 0 && !spec.parked) {
    const mark = new Map([...queries.timings].map(([label, xs]) => [label, xs.length]));
    const h0 = hot;
    const t0 = performance.now();
    await sleep(spec.hotSeconds * 1000);
    const alone = hot - h0;
    hotRateAlone = alone / ((performance.now() - t0) / 1000);
    const starts = hotStarts.slice(h0);
    hotGapMs = median(starts.slice(1).map((t, i) => t - (starts[i] ?? t)));
    for (const [label, xs] of queries.timings) {
      const since = xs.slice(mark.get(label) ?? 0);
      if (since.length) statementMs[label] = median(since);
    }
    const leases = (queries.timings.get("lease")?.length ?? 0) - (mark.get("lease") ?? 0);
    leasesPerHotRow = leases / alone;
  }
  await peer.stopWorker();
  await pool.end();
  await peer.teardown();
  if (other !== others) throw new Error(`${other} handler calls for ${others} other-key rows`);
  return {
    otherRate: others / otherSeconds,
    otherSeconds,
    hotRateMixed: hotMixed / otherSeconds,
    hotRateAlone,
    hotGapMs,
    leasesPerHotRow,
    statementMs,
    orderViolations: order.violations + hotViolations,
    plans,
  };
}

/**
 * The fetch and the completion alone at `rows` rows, keyless (keys 0) or over `keys` keys (rows / keys per
 * key, interleaved): `timed` rounds of "lease N, then complete them" per N, as the worker runs them
 * (prepared; keyed: one call of ack_key_heads, which promotes, so the next heads are there for the next round).
 */
async function keyScale(spec: Extract<JobSpec, { kind: "keyScale" }>): Promise<KeyScaleResult> {
  const schema = "bench_key_scale";
  const names = outboxNames(schema);
  const peer = outboxPeer(schema);
  const pool = new pg.Pool({ connectionString: DATABASE_URL, max: 2 });
  await peer.setup();
  // In slices, so no single transaction holds a million new rows.
  for (let a = 1; a <= spec.rows; a += 250_000) {
    const b = Math.min(spec.rows, a + 249_999);
    if (spec.keys > 0) {
      await withoutKeyTrigger(
        pool,
        schema,
        `INSERT INTO ${names.messages} (queue, payload, key, head)
         SELECT '${QUEUE}', ${PAYLOAD_SQL}, 'k' || (g % ${spec.keys}), g <= ${spec.keys}
         FROM generate_series(${a}, ${b}) AS g`,
      );
    } else {
      await pool.query(
        `INSERT INTO ${names.messages} (queue, payload)
         SELECT '${QUEUE}', ${PAYLOAD_SQL} FROM generate_series(${a}, ${b}) AS g`,
      );
    }
  }
  await checkHeads(pool, schema, spec.rows, spec.keys > 0 ? spec.keys : spec.rows);
  await vacuumSchema(pool, schema);
  const plans = await explainStatements(pool, schema, spec.rows, spec.keys > 0);

  const fetch = fetchStatement(names, { synchronousCommit: false }, true);
  const sql = completeStatements(names, { synchronousCommit: false });
  const timedFetch: KeyScaleResult["timedFetch"] = [];
  const timedAck: KeyScaleResult["timedAck"] = [];
  const client = await pool.connect();
  for (const limit of [100, 500]) {
    const fetchMs: number[] = [];
    const ackMs: number[] = [];
    for (let i = 0; i < spec.timed; i++) {
      const token = randomUUID();
      let t = performance.now();
      const rows = await runQuery(
        client,
        fetch,
        { queues: [QUEUE], limit, token, leaseTtlMs: 30000, workerId: "timing" },
        { prepared: true },
      );
      fetchMs.push(performance.now() - t);
      if (rows.length !== limit) throw new Error(`leased ${rows.length} rows, asked for ${limit}`);
      const pairs = { ids: rows.map((r) => r.id), tokens: rows.map(() => token) };
      t = performance.now();
      if (spec.keys > 0) {
        // One call of ack_key_heads, as the worker makes it: completion and promotion (limit 0: no
        // hand-off; the next round's fetch leases the new heads, as a worker without room would).
        await runQuery(
          client,
          sql.ackKeyHeads,
          {
            ...pairs,
            queues: textArray(rows.map((r) => r.queue)),
            keys: textArray(rows.map((r) => r.key)),
            limit: 0,
            token,
            leaseTtlMs: 30000,
            workerId: "timing",
          },
          { prepared: true },
        );
      } else {
        await runQuery(client, sql.ack, pairs, { prepared: true });
      }
      ackMs.push(performance.now() - t);
    }
    timedFetch.push({ limit, p50: percentile(fetchMs, 50), p99: percentile(fetchMs, 99) });
    timedAck.push({ limit, p50: percentile(ackMs, 50), p99: percentile(ackMs, 99) });
  }
  client.release();
  await pool.end();
  await peer.teardown();
  return { plans, timedFetch, timedAck };
}

const spec = JSON.parse(process.argv[2] ?? "{}") as JobSpec;
const result =
  spec.kind === "drain"
    ? await drain(spec)
    : spec.kind === "sql"
      ? await sqlCeiling(spec)
      : spec.kind === "latency"
        ? await latency(spec)
        : spec.kind === "producer"
          ? await producer(spec)
          : spec.kind === "hotKey"
            ? await hotKey(spec)
            : spec.kind === "keyScale"
              ? await keyScale(spec)
              : spec.kind === "steady"
                ? await steady(spec)
                : await scale(spec);
process.stdout.write(`${RESULT_MARK}${JSON.stringify(result)}\n`);
// Peers may leave timers behind (pg-boss maintenance, pools): the result is out, so leave now.
process.exit(0);
