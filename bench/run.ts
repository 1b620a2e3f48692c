/**
 * Side-by-side benchmarks: this project, graphile-worker and pg-boss, plus pure-SQL ceilings. Runs the
 * sections in sequence (never two measurements at once), each measurement in a fresh process and a fresh
 * schema, and writes the tables with medians, ranges and ratios.
 *
 *   npm run bench                      # full: writes bench/RESULTS.md
 *   npm run bench:quick                # under 3 minutes, 1 run each: writes bench/RESULTS.quick.md
 *   npm run bench -- --only drain,scale --out /tmp/r.md
 *   npm run bench -- --only followups --out /tmp/f.md    # what follow-up messages cost the drain
 *   npm run bench -- --only txhandler --out /tmp/t.md    # what a handler committing with its ack costs
 *
 * Peers come from bench/package.json (installed into bench/node_modules by the npm scripts).
 */
import { execFileSync } from "node:child_process";
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import os from "node:os";
import pg from "pg";
import type { FollowUpKeyResult } from "./follow-up-keys.js";
import type { FollowUpResult } from "./follow-ups.js";
import type {
  DrainResult,
  HotKeyResult,
  JobSpec,
  KeyScaleResult,
  LatencyResult,
  PeerName,
  PlanCheck,
  ProducerResult,
  ScaleResult,
} from "./job.js";
import { arg, DATABASE_URL, fmt, machineCpuSeconds, median, ROOT, range, runJob, sleep } from "./lib.js";
import { GRAPHILE_LOCAL_QUEUE, GRAPHILE_POLL_ONLY_INTERVAL_MS } from "./peers/graphile.js";
import { PRODUCER_KEYS } from "./peers/outbox.js";
import { PGBOSS_POLL_SECONDS, pgbossTuning } from "./peers/pgboss.js";
import { SQL_BATCH } from "./peers/sql.js";
import type { TxHandlerResult } from "./tx-handler.js";

const quick = process.argv.includes("--quick");
const P = quick
  ? {
      runs: 1,
      drainRows: 10_000,
      latencySeconds: 3,
      producerSeconds: 2,
      scaleSizes: [10_000, 100_000],
      timed: 50,
      ordering: {
        rows: 10_000,
        keys: 2_000,
        hotRows: 20_000,
        hotSeconds: 2,
        scaleRows: 100_000,
        scaleKeys: 10_000,
        producerSeconds: 2,
        cappedSeconds: 10,
      },
    }
  : {
      runs: 3,
      drainRows: 50_000,
      latencySeconds: 10,
      producerSeconds: 10,
      scaleSizes: [10_000, 100_000, 1_000_000],
      timed: 200,
      ordering: {
        rows: 50_000,
        keys: 10_000,
        hotRows: 100_000,
        hotSeconds: 5,
        scaleRows: 1_000_000,
        scaleKeys: 100_000,
        producerSeconds: 10,
        cappedSeconds: 20,
      },
    };
const runs = Number(arg("runs", String(P.runs)));
const only = arg("only", "drain,latency,producer,scale,ordering").split(",");
const out = arg("out", `${ROOT}bench/${quick ? "RESULTS.quick.md" : "RESULTS.md"}`);
const CONCURRENCIES = [10, 32];
const SQL_CONNECTIONS = [2, 4];
const OUR_BATCH = 500;
/** The concurrency of the extra drain of ours with `synchronousCommit: true`. */
const SYNC_CONCURRENCY = 10;
/** The concurrency of the extra drain of ours with a `rawPayload: true` queue (what every relay is). */
const RAW_CONCURRENCY = 10;
const RATE = 200;
const CLIENTS = 8;
const PUBLISH_MANY = 1000;
const SCALE_CONCURRENCY = 10;
/** Hot-key jobs (hot key present, and parked) per run of the ordering section: see orderingSection. */
const HOT_PAIRS_PER_RUN = 2;

const LABEL: Record<PeerName, string> = {
  outbox: "pg-outbox-worker",
  graphile: "graphile-worker (batched)",
  pgboss: "pg-boss (batch fetch)",
};

const md: string[] = [];
const say = (line = "") => {
  md.push(line);
  console.log(line);
};
/** A markdown table; columns whose cells all start like a number are right-aligned. */
const table = (head: string[], rows: string[][]) => {
  const numeric = head.map((_, i) => i > 0 && rows.every((r) => /^(\*\*)?[\d–-]/.test(r[i] ?? "")));
  say(`| ${head.join(" | ")} |`);
  say(`|${numeric.map((n) => (n ? "---:" : "---")).join("|")}|`);
  for (const r of rows) say(`| ${r.join(" | ")} |`);
  say();
};
const started = Date.now();
const elapsed = () => `${((Date.now() - started) / 1000).toFixed(0)} s`;
const progress = (what: string) => process.stderr.write(`[${elapsed()}] ${what}\n`);

/** CPU-seconds per second the whole machine spends over the next second (all cores together). */
async function busy(): Promise<number> {
  const before = machineCpuSeconds();
  await sleep(1000);
  return machineCpuSeconds() - before;
}

/**
 * Other load (a test suite, say) would distort a figure: a job starts only on an idle machine (waiting up to
 * 3 minutes), and is run again (at most twice) if the machine is busy right after it, when nothing of the
 * bench runs any more. Each check is one second of /proc/stat.
 */
const QUIET = 0.25;
let repeated = 0;
async function job<T>(spec: JobSpec): Promise<T> {
  for (let attempt = 0; ; attempt++) {
    for (const deadline = Date.now() + 180_000; Date.now() < deadline; ) {
      const b = await busy();
      if (b < QUIET) break;
      progress(`machine busy (${b.toFixed(2)} CPU-s/s) before a job: waiting`);
    }
    progress(JSON.stringify(spec));
    const result = await runJob<T>(spec);
    await sleep(300);
    const after = await busy();
    if (after < QUIET || attempt >= 2) return result;
    repeated++;
    progress(`machine busy (${after.toFixed(2)} CPU-s/s) after the job: running it again`);
  }
}

/** Median and range, e.g. "45,123 (43,000–47,002)". */
const mr = (xs: number[], digits = 0) => `${fmt(median(xs), digits)} (${range(xs, digits)})`;
/** Ratio of medians, and the range of the run-by-run ratios. */
function ratio(ours: number[], theirs: number[]): { value: number; text: string } {
  const value = median(ours) / median(theirs);
  const per = ours.map((x, i) => x / (theirs[i] ?? Number.NaN)).filter(Number.isFinite);
  return { value, text: `${value.toFixed(2)}× (${range(per, 2)})` };
}

interface Target {
  what: string;
  measured: string;
  holds: boolean;
}
const targets: Target[] = [];

// ---------------------------------------------------------------------------------------------- setup

const pool = new pg.Pool({ connectionString: DATABASE_URL, max: 1 });
const pgVersion = (await pool.query("SHOW server_version")).rows[0].server_version as string;
const settings = (
  await pool.query<{ name: string; setting: string; unit: string | null }>(
    `SELECT name, setting, unit FROM pg_settings WHERE name IN
     ('shared_buffers', 'synchronous_commit', 'autovacuum', 'jit', 'max_connections', 'plan_cache_mode')
     ORDER BY name`,
  )
).rows
  .map((r) => `${r.name} ${r.unit === "8kB" ? `${(Number(r.setting) * 8) / 1024}MB` : r.setting}`)
  .join(", ");
await pool.end();
// A section of ours alone (`--only followups`) runs without the peers installed in bench/node_modules.
const version = (pkg: string) => {
  const file = `${ROOT}bench/node_modules/${pkg}/package.json`;
  if (!existsSync(file)) return "(not installed)";
  return (JSON.parse(readFileSync(file, "utf8")) as { version: string }).version;
};
const versions = { graphile: version("graphile-worker"), pgboss: version("pg-boss") };

say("# Benchmark results");
say();
say(
  `Command: \`npm run ${quick ? "bench:quick" : "bench"}\` (\`tsx bench/run.ts${quick ? " --quick" : ""}\`, from the repository root; ` +
    `DATABASE_URL=${DATABASE_URL.replace(/\/\/([^:@/]+):[^@]*@/, "//$1:***@")}), ${new Date().toISOString().slice(0, 10)}.`,
);
say();
say(
  `Machine: ${os.cpus().length} cores (${os.cpus()[0]?.model.trim()}), ${Math.round(os.totalmem() / 2 ** 30)} GiB, ` +
    `PostgreSQL ${pgVersion} (Debian package, as configured here: ${settings}), Node ${process.version}, ` +
    `one machine for Postgres and the benchmark. graphile-worker ${versions.graphile}, pg-boss ${versions.pgboss} ` +
    `(both declare \`engines.node >= 22\`; they run unmodified on this Node 20, see "Versions").`,
);
say();
say(
  `Every figure is the median (range min–max) of ${runs} run${runs > 1 ? "s" : ""}. Each run is a fresh process ` +
    "(`tsx bench/job.ts`) in a fresh schema, filled, then `VACUUM ANALYZE` and `CHECKPOINT` before the clock " +
    "starts; the schema is dropped after. Runs of different systems are interleaved, so drift hits all alike. " +
    "Ratios are ratios of medians, with the range of the run-by-run ratios. Each job starts only on an " +
    `idle machine (< ${QUIET} CPU-seconds a second over 1 s) and is repeated if the machine is busy right after it ` +
    "(see the end for how many were).",
);
say();

// ---------------------------------------------------------------------------------------------- drain

/** One row of the drain table: rate, CPU per message (worker, rest), statements per message. */
function drainRow(name: string, xs: DrainResult[] = []): string[] {
  return [
    name,
    mr(xs.map((x) => x.rate)),
    fmt(median(xs.map((x) => x.cpuNode)), 1),
    fmt(median(xs.map((x) => x.cpuRest)), 1),
    fmt(median(xs.map((x) => x.roundTrips)), 4),
  ];
}

async function drainSection() {
  const rows = P.drainRows;
  const results = new Map<string, DrainResult[]>();
  const add = (key: string, r: DrainResult) => results.set(key, [...(results.get(key) ?? []), r]);
  for (let r = 0; r < runs; r++) {
    for (const c of CONCURRENCIES) {
      for (const peer of ["outbox", "graphile", "pgboss"] as const) {
        // Ours with default options (only the concurrency set): what users run.
        add(`${peer}:${c}`, await job<DrainResult>({ kind: "drain", peer, concurrency: c, rows }));
      }
    }
    // Ours waiting for the WAL flush on its writes, as the peers do: what the synchronous_commit default buys.
    add(
      `outbox-sync:${SYNC_CONCURRENCY}`,
      await job<DrainResult>({
        kind: "drain",
        peer: "outbox",
        concurrency: SYNC_CONCURRENCY,
        rows,
        tuning: { synchronousCommit: 1 },
      }),
    );
    // Ours with the stored payload text handed over unparsed, as to every relay: what JSON.parse costs.
    add(
      `outbox-raw:${RAW_CONCURRENCY}`,
      await job<DrainResult>({
        kind: "drain",
        peer: "outbox",
        concurrency: RAW_CONCURRENCY,
        rows,
        tuning: { rawPayload: 1 },
      }),
    );
    for (const variant of ["lease-delete", "lease-ack"] as const) {
      for (const n of SQL_CONNECTIONS) {
        add(`${variant}:${n}`, await job<DrainResult>({ kind: "sql", variant, connections: n, rows }));
      }
    }
  }
  const rate = (key: string) => (results.get(key) ?? []).map((x) => x.rate);
  // The stricter ceiling: whichever connection count drained faster.
  const ceilingKey =
    SQL_CONNECTIONS.map((n) => `lease-ack:${n}`).sort((a, b) => median(rate(b)) - median(rate(a)))[0] ?? "";

  say("## 1. Drain");
  say();
  say(
    `${fmt(rows)} rows (~100-byte JSON payloads) inserted up front; one worker process with a no-op handler; ` +
      "rows/s from the first handler start until a poll of the table (every 2 ms, once every handler has run) " +
      "finds no unfinished row. CPU columns: CPU time per message of the worker process, and of the rest of " +
      "the machine (Postgres) during the drain, from /proc; statements per message at steady state " +
      "(between 10 % and 90 % of the backlog; see section 5).",
  );
  say();
  const rowsOut: string[][] = [];
  for (const c of CONCURRENCIES) {
    for (const peer of ["outbox", "graphile", "pgboss"] as const) {
      rowsOut.push(drainRow(`${LABEL[peer]}, concurrency ${c}`, results.get(`${peer}:${c}`)));
    }
  }
  rowsOut.push(
    drainRow(
      `${LABEL.outbox}, concurrency ${SYNC_CONCURRENCY}, \`synchronousCommit: true\``,
      results.get(`outbox-sync:${SYNC_CONCURRENCY}`),
    ),
  );
  rowsOut.push(
    drainRow(
      `${LABEL.outbox}, concurrency ${RAW_CONCURRENCY}, \`rawPayload: true\` queue (as the relays)`,
      results.get(`outbox-raw:${RAW_CONCURRENCY}`),
    ),
  );
  for (const variant of ["lease-delete", "lease-ack"] as const) {
    for (const n of SQL_CONNECTIONS) {
      const name =
        variant === "lease-delete"
          ? `SQL ceiling: lease+delete ${SQL_BATCH} in one statement, ${n} connections`
          : `SQL ceiling: lease ${SQL_BATCH} (our fetch) then fenced delete (our ack), ${n} connections`;
      rowsOut.push(drainRow(name, results.get(`${variant}:${n}`)));
    }
  }
  table(["system", "rows/s", "CPU µs/msg, worker", "CPU µs/msg, rest (Postgres)", "statements/msg"], rowsOut);

  const ratioRows: string[][] = [];
  for (const c of CONCURRENCIES) {
    const ours = rate(`outbox:${c}`);
    const g = ratio(ours, rate(`graphile:${c}`));
    const b = ratio(ours, rate(`pgboss:${c}`));
    const s = ratio(ours, rate(ceilingKey));
    const d = ratio(ours, rate(`lease-delete:${Math.max(...SQL_CONNECTIONS)}`));
    ratioRows.push([`concurrency ${c}`, g.text, b.text, s.text, d.text]);
    targets.push(
      {
        what: `drain ≥ 1.5× graphile-worker batched (concurrency ${c})`,
        measured: g.text,
        holds: g.value >= 1.5,
      },
      { what: `drain ≥ 3× pg-boss (concurrency ${c})`, measured: b.text, holds: b.value >= 3 },
      {
        what: `drain ≥ 0.7× the lease-then-fenced-delete SQL ceiling (concurrency ${c})`,
        measured: s.text,
        holds: s.value >= 0.7,
      },
    );
  }
  say("Ratios, this project ÷ each:");
  say();
  table(
    [
      "",
      "÷ graphile-worker",
      "÷ pg-boss",
      `÷ lease-then-fenced-delete ceiling (${ceilingKey.split(":")[1]} conn.)`,
      `÷ one-statement lease+delete ceiling (${Math.max(...SQL_CONNECTIONS)} conn.)`,
    ],
    ratioRows,
  );
  const ours = results.get(`outbox:${CONCURRENCIES[0]}`) ?? [];
  if (ours[0]?.leaseMs !== undefined) {
    say(
      `This project at concurrency ${CONCURRENCIES[0]}: a lease statement takes ${fmt(median(ours.map((x) => x.leaseMs ?? 0)), 1)} ms ` +
        `and an ack ${fmt(median(ours.map((x) => x.ackMs ?? 0)), 1)} ms (medians, client side), ` +
        `${fmt(median(ours.map((x) => rows / (x.leases ?? 1))))} rows per lease.`,
    );
    say();
  }
  return results;
}

// -------------------------------------------------------------------------------------------- latency

async function latencySection() {
  const modes = [
    ["outbox", true],
    ["outbox-sync", true],
    ["outbox", false],
    ["graphile", true],
    ["graphile", false],
    ["pgboss", true],
    ["pgboss", false],
  ] as const;
  const results = new Map<string, LatencyResult[]>();
  for (let r = 0; r < runs; r++) {
    for (const [peer, listen] of modes) {
      const res = await job<LatencyResult>({
        kind: "latency",
        peer: peer === "outbox-sync" ? "outbox" : peer,
        listen,
        rate: RATE,
        seconds: P.latencySeconds,
        ...(peer === "outbox-sync" ? { tuning: { synchronousCommit: 1 } } : {}),
      });
      results.set(`${peer}:${listen}`, [...(results.get(`${peer}:${listen}`) ?? []), res]);
    }
  }
  say("## 2. Pickup latency");
  say();
  say(
    `An idle worker (concurrency 10, started 1 s before); ${RATE} single-message producer transactions a second for ` +
      `${P.latencySeconds} s from a pool of 4; time from the producer's commit returning to the handler starting, in one ` +
      "process (one clock; a handler that starts before its producer saw COMMIT return counts as 0). Producers: " +
      "this project `BEGIN; publish(); COMMIT` (default throttled wake-ups), graphile-worker `addJob`, pg-boss `send`. " +
      `Poll-only intervals: this project's default minPollIntervalMs, 100 ms (without wake-ups it does not back off), graphile-worker ${GRAPHILE_POLL_ONLY_INTERVAL_MS} ms, ` +
      `pg-boss ${PGBOSS_POLL_SECONDS} s (its minimum).`,
  );
  say();
  const rowsOut = modes.map(([peer, listen]) => {
    const xs = results.get(`${peer}:${listen}`) ?? [];
    const m = (k: keyof LatencyResult) =>
      mr(
        xs.map((x) => x[k]),
        1,
      );
    const name =
      peer === "outbox-sync"
        ? `${LABEL.outbox}, LISTEN/NOTIFY, \`synchronousCommit: true\``
        : `${LABEL[peer].replace(/ \(.*\)/, "")}, ${listen ? "LISTEN/NOTIFY" : "poll only"}`;
    return [name, m("p50"), m("p95"), m("p99"), m("max")];
  });
  table(["system, wake-ups", "p50 ms", "p95 ms", "p99 ms", "max ms"], rowsOut);
  const ours = results.get("outbox:true") ?? [];
  const p50 = median(ours.map((x) => x.p50));
  const p99 = median(ours.map((x) => x.p99));
  targets.push(
    {
      what: "pickup with wake-ups p50 ≤ 2 ms",
      measured: `${fmt(p50, 1)} ms (${range(
        ours.map((x) => x.p50),
        1,
      )})`,
      holds: p50 <= 2,
    },
    {
      what: "pickup with wake-ups p99 ≤ 10 ms",
      measured: `${fmt(p99, 1)} ms (${range(
        ours.map((x) => x.p99),
        1,
      )})`,
      holds: p99 <= 10,
    },
  );
}

// ------------------------------------------------------------------------------------------- producer

async function producerSection() {
  const modes: {
    key: string;
    label: string;
    spec: Omit<Extract<JobSpec, { kind: "producer" }>, "kind" | "clients" | "seconds">;
  }[] = [
    {
      key: "plain",
      label: "this project: plain INSERT, no notification (baseline)",
      spec: { peer: "outbox", mode: "plain" },
    },
    {
      key: "plainUnnamed",
      label: "this project: plain INSERT as pg sends it by default (unnamed statement), no notification",
      spec: { peer: "outbox", mode: "plainUnnamed" },
    },
    {
      key: "publish",
      label: "this project: `publish`, throttled wake-ups (default)",
      spec: { peer: "outbox", mode: "default" },
    },
    {
      key: "keyed",
      label: `this project: \`publish\` with a key (${fmt(PRODUCER_KEYS)} keys: key lock + key-head trigger), throttled wake-ups`,
      spec: { peer: "outbox", mode: "keyed" },
    },
    {
      key: "silent",
      label: "this project: `publish`, wake-ups off (`notify: false`)",
      spec: { peer: "outbox", mode: "silent" },
    },
    {
      key: "autocommit",
      label:
        "this project: `publish(pool, …)` autocommit, throttled wake-ups (one statement, like the peers)",
      spec: { peer: "outbox", mode: "autocommit" },
    },
    {
      key: "every",
      label: "this project: `publish`, NOTIFY in every transaction",
      spec: { peer: "outbox", mode: "every" },
    },
    {
      key: "trigger",
      label: "this project: plain INSERT + optional NOTIFY trigger",
      spec: { peer: "outbox", mode: "trigger" },
    },
    {
      key: "boss",
      label: "pg-boss `send`, queue with `notify: true`",
      spec: { peer: "pgboss", mode: "default" },
    },
    {
      key: "bossQuiet",
      label: "pg-boss `send`, queue without notify",
      spec: { peer: "pgboss", mode: "quiet" },
    },
    {
      key: "graphile",
      label: "graphile-worker `addJob` (always notifies)",
      spec: { peer: "graphile", mode: "default" },
    },
    {
      key: "many",
      label: `this project: \`publishMany\`, ${PUBLISH_MANY} rows per statement`,
      spec: { peer: "outbox", mode: "default", batch: PUBLISH_MANY },
    },
    {
      key: "bossMany",
      label: `pg-boss \`insert\`, ${PUBLISH_MANY} jobs per call`,
      spec: { peer: "pgboss", mode: "default", batch: PUBLISH_MANY },
    },
    {
      key: "graphileMany",
      label: `graphile-worker \`addJobs\`, ${PUBLISH_MANY} jobs per call`,
      spec: { peer: "graphile", mode: "default", batch: PUBLISH_MANY },
    },
  ];
  const results = new Map<string, ProducerResult[]>();
  for (let r = 0; r < runs; r++) {
    for (const m of modes) {
      const res = await job<ProducerResult>({
        kind: "producer",
        clients: CLIENTS,
        seconds: P.producerSeconds,
        ...m.spec,
      });
      results.set(m.key, [...(results.get(m.key) ?? []), res]);
    }
  }
  const tx = (key: string) => (results.get(key) ?? []).map((x) => x.txPerSec);
  const rowsPs = (key: string) => (results.get(key) ?? []).map((x) => x.rowsPerSec);
  say("## 3. Producer cost");
  say();
  say(
    `${CLIENTS} clients publishing for ${P.producerSeconds} s, a worker-like LISTEN connection attached on the system's ` +
      "channel. This project's single-message rows are `BEGIN; INSERT/publish; COMMIT` (three round trips, as in a " +
      "producer's own transaction); graphile-worker's `addJob` and pg-boss's `send` are one autocommit statement each.",
  );
  say();
  const base = tx("plain");
  table(
    ["producer", "tx/s", "rows/s", "vs plain INSERT", "notifications/s"],
    modes.map((m) => [
      m.label,
      mr(tx(m.key)),
      fmt(median(rowsPs(m.key))),
      `${((median(tx(m.key)) / median(base)) * 100).toFixed(0)} %`,
      fmt(median((results.get(m.key) ?? []).map((x) => x.notificationsPerSec))),
    ]),
  );
  const keep = ratio(tx("publish"), base);
  const keepUnnamed = ratio(tx("publish"), tx("plainUnnamed"));
  const vsBoss = ratio(tx("publish"), tx("boss"));
  const vsGraphile = ratio(tx("publish"), tx("graphile"));
  const autoBoss = ratio(tx("autocommit"), tx("boss"));
  const autoGraphile = ratio(tx("autocommit"), tx("graphile"));
  say(
    `\`publish\` with wake-ups in a transaction (3 round trips) ÷ plain INSERT: ${keep.text}; ÷ pg-boss \`send\` ` +
      `(notify): ${vsBoss.text}; ÷ pg-boss \`send\` (no notify): ${ratio(tx("publish"), tx("bossQuiet")).text}; ` +
      `÷ graphile-worker \`addJob\`: ${vsGraphile.text}. Like for like (one autocommit statement each), ` +
      `\`publish(pool, …)\` ÷ pg-boss \`send\` (notify): ${autoBoss.text}; ÷ graphile-worker \`addJob\`: ${autoGraphile.text}.`,
  );
  say();
  targets.push(
    {
      what: "producers keep ≥ 90 % of plain-INSERT throughput with wake-ups on (baseline: a named prepared INSERT)",
      measured: keep.text,
      holds: keep.value >= 0.9,
    },
    {
      what: "producers keep ≥ 90 % of plain-INSERT throughput with wake-ups on (baseline: pg's default, unnamed, as `publish`)",
      measured: keepUnnamed.text,
      holds: keepUnnamed.value >= 0.9,
    },
    {
      what: "producer ≥ 3× pg-boss single-job `send` (ours in a BEGIN/COMMIT transaction)",
      measured: vsBoss.text,
      holds: vsBoss.value >= 3,
    },
    {
      what: "producer ≥ 5× graphile-worker single-job `addJob` (ours in a BEGIN/COMMIT transaction)",
      measured: vsGraphile.text,
      holds: vsGraphile.value >= 5,
    },
    {
      what: "producer ≥ 3× pg-boss `send`, like for like (ours `publish(pool, …)`, one autocommit statement)",
      measured: autoBoss.text,
      holds: autoBoss.value >= 3,
    },
    {
      what: "producer ≥ 5× graphile-worker `addJob`, like for like (ours `publish(pool, …)`)",
      measured: autoGraphile.text,
      holds: autoGraphile.value >= 5,
    },
  );
}

// ---------------------------------------------------------------------------------------------- scale

async function scaleSection(drain: Map<string, DrainResult[]> | undefined) {
  // The drain of this section runs the compiled package under plain node: build it first.
  progress("npm run build (dist/, for bench/drain-compiled.mjs)");
  execFileSync("npm", ["run", "-s", "build"], { cwd: ROOT, stdio: "inherit" });
  const results: ScaleResult[] = [];
  for (let r = 0; r < runs; r++) {
    results.push(
      await job<ScaleResult>({
        kind: "scale",
        sizes: P.scaleSizes,
        concurrency: SCALE_CONCURRENCY,
        timed: P.timed,
      }),
    );
  }
  const top = P.scaleSizes[P.scaleSizes.length - 1] ?? 0;
  const pick = (f: (s: ScaleResult) => number, digits = 1) => mr(results.map(f), digits);
  say("## 4. Scale");
  say();
  say(
    `A backlog of ${fmt(top)} rows. Statement times are client-side wall times on an otherwise idle connection: ` +
      `${P.timed} rounds of "lease N with the fetch statement, then delete them with the ack statement" per size N, on the ` +
      `full backlog (the rows they take are topped up again before the drain). Then one worker (concurrency ${SCALE_CONCURRENCY}, ` +
      `batchSize ${OUR_BATCH}) drains the whole backlog: the compiled package (\`npm run build\`) under plain node, ` +
      "no tsx loader, as in production (bench/drain-compiled.mjs): RSS sampled every 100 ms, rows/s over the first " +
      "and the last 10 % of the backlog, and the same statements as the worker saw them (client side, so " +
      "including event-loop waits). Note autovacuum is off on this server: dead rows stay until the next VACUUM.",
  );
  say();
  const sizes = [...new Set(results[0]?.timedFetch.map((t) => t.limit) ?? [])];
  const rowsOut: string[][] = [];
  for (const limit of sizes) {
    rowsOut.push([
      `fetch statement, lease ${limit} (isolated)`,
      pick((s) => s.timedFetch.find((t) => t.limit === limit)?.p50 ?? Number.NaN),
      pick((s) => s.timedFetch.find((t) => t.limit === limit)?.p99 ?? Number.NaN),
    ]);
    rowsOut.push([
      `ack statement, delete ${limit} fenced (isolated)`,
      pick((s) => s.timedAck.find((t) => t.limit === limit)?.p50 ?? Number.NaN),
      pick((s) => s.timedAck.find((t) => t.limit === limit)?.p99 ?? Number.NaN),
    ]);
  }
  rowsOut.push([
    "fetch statement inside the draining worker",
    pick((s) => s.workerFetch.p50),
    pick((s) => s.workerFetch.p99),
  ]);
  rowsOut.push([
    "ack statement inside the draining worker",
    pick((s) => s.workerAck.p50),
    pick((s) => s.workerAck.p99),
  ]);
  table([`at ${fmt(top)} rows`, "p50 ms", "p99 ms"], rowsOut);
  table(
    ["draining the backlog", "value"],
    [
      ["RSS peak, MB", pick((s) => s.rssMaxMb, 0)],
      ["RSS median, MB", pick((s) => s.rssMedianMb, 0)],
      ["RSS before the worker started (same process, modules loaded), MB", pick((s) => s.rssIdleMb, 0)],
      ["rows/s, first 10 % of the backlog", pick((s) => s.startRate, 0)],
      ["rows/s, last 10 %", pick((s) => s.endRate, 0)],
      ["rows/s, whole drain", pick((s) => s.rate, 0)],
      ["statements per message (steady state)", pick((s) => s.roundTrips, 4)],
    ],
  );
  say(
    "Plans, `EXPLAIN (ANALYZE)` of the prepared statements with default planner settings, as a custom plan " +
      "(`plan_cache_mode = force_custom_plan`, what the first five executions get) and as the generic plan pg " +
      "switches a prepared statement to later (`force_generic_plan`); fetch leases 500, ack deletes 500 leased rows " +
      "by (id, token); rolled back. Scans listed top-down; a plan passes when no scan of `messages` is a sequential " +
      "or bitmap scan. From the first run:",
  );
  say();
  const plans: PlanCheck[] = results[0]?.plans ?? [];
  table(
    ["rows", "statement", "plan", "scans (node types, indexes)", "execution ms", "index plan"],
    plans.map((p) => [fmt(p.rows), p.statement, p.mode, p.scans, fmt(p.ms, 2), p.ok ? "yes" : "**no**"]),
  );
  const jitted = plans.filter((p) => p.scans.includes("JIT"));
  if (jitted.length) {
    say(
      `JIT: ${jitted.map((p) => `the ${p.mode} ${p.statement} plan at ${fmt(p.rows)} rows`).join(", ")} ` +
        "was JIT-compiled: with the LIMIT a parameter, the generic plan's cost estimate crosses `jit_above_cost` " +
        "(100000), and the compilation, not the scans, is what its execution time measures. With " +
        "`plan_cache_mode = auto` pg keeps choosing the far cheaper custom plan, so the worker does not run it.",
    );
    say();
  }
  const allPlans = results.flatMap((s) => s.plans);
  const fetch500 = results.map((s) => s.timedFetch.find((t) => t.limit === OUR_BATCH)?.p99 ?? Number.NaN);
  const fetch100 = results.map((s) => s.timedFetch.find((t) => t.limit === 100)?.p99 ?? Number.NaN);
  const rss = results.map((s) => s.rssMaxMb);
  targets.push(
    {
      what: `RSS < 200 MB draining ${fmt(top)} rows`,
      measured: `${mr(rss, 0)} MB peak`,
      holds: median(rss) < 200,
    },
    {
      what: `fetch p99 < 5 ms at ${fmt(top)} rows (lease 100)`,
      measured: `${mr(fetch100, 1)} ms`,
      holds: median(fetch100) < 5,
    },
    {
      what: `fetch p99 < 5 ms at ${fmt(top)} rows (lease ${OUR_BATCH}, the default batchSize)`,
      measured: `${mr(fetch500, 1)} ms`,
      holds: median(fetch500) < 5,
    },
    {
      what: "fetch and ack get index plans at every size (custom and generic plans, every run)",
      measured: `${allPlans.filter((p) => p.ok).length} of ${allPlans.length} plans`,
      holds: allPlans.every((p) => p.ok),
    },
  );
  return { results, drain };
}

// ---------------------------------------------------------------------------------------- round trips

function roundTripSection(drain: Map<string, DrainResult[]> | undefined, scale: ScaleResult[] | undefined) {
  say("## 5. Round trips per message");
  say();
  say(
    "pg_stat_statements is not loaded on this server (it needs `shared_preload_libraries`), and `xact_commit` " +
      "deltas would count other sessions: every statement the worker process sends is counted instead, by " +
      "wrapping `Client.prototype.query` of both copies of pg in that process (pools, LISTEN connection, peers' own " +
      "clients). Statements sent between the 10 % and the 90 % mark of the backlog, ÷ messages in that window.",
  );
  say();
  const rowsOut: string[][] = [];
  for (const c of CONCURRENCIES) {
    for (const peer of ["outbox", "graphile", "pgboss"] as const) {
      const xs = drain?.get(`${peer}:${c}`);
      if (xs)
        rowsOut.push([
          `${LABEL[peer]}, ${fmt(P.drainRows)}-row drain, concurrency ${c}`,
          mr(
            xs.map((x) => x.roundTrips),
            4,
          ),
        ]);
    }
  }
  if (scale?.length) {
    const top = P.scaleSizes[P.scaleSizes.length - 1] ?? 0;
    rowsOut.push([
      `pg-outbox-worker, ${fmt(top)}-row drain, concurrency ${SCALE_CONCURRENCY}`,
      mr(
        scale.map((s) => s.roundTrips),
        4,
      ),
    ]);
  }
  table(["worker", "statements per message"], rowsOut);
  const ours = [
    ...CONCURRENCIES.flatMap((c) => (drain?.get(`outbox:${c}`) ?? []).map((x) => x.roundTrips)),
    ...(scale ?? []).map((s) => s.roundTrips),
  ];
  if (ours.length) {
    targets.push({
      what: "≤ 0.05 round trips per message at steady state",
      measured: `${fmt(Math.max(...ours), 4)} (worst run)`,
      holds: Math.max(...ours) <= 0.05,
    });
  }
}

// ------------------------------------------------------------------------------------------- ordering

/** Cells of a drain row with its per-key order check. */
const orderCell = (xs: DrainResult[] = []) =>
  xs.some((x) => x.orderViolations === undefined)
    ? "–"
    : String(Math.max(...xs.map((x) => x.orderViolations ?? 0)));

async function orderingSection() {
  const O = P.ordering;
  const command = `tsx bench/run.ts ${process.argv.slice(2).join(" ")}`.trim();
  const drains = new Map<string, DrainResult[]>();
  const hot: HotKeyResult[] = [];
  const cold: HotKeyResult[] = [];
  const parkedHot: HotKeyResult[] = [];
  const scales = new Map<string, KeyScaleResult[]>();
  const produced = new Map<string, ProducerResult[]>();
  const add = <T>(m: Map<string, T[]>, key: string, x: T) => m.set(key, [...(m.get(key) ?? []), x]);
  const systems = [
    { key: "outbox", peer: "outbox", keys: undefined },
    { key: "outbox-keyed", peer: "outbox", keys: O.keys },
    { key: "graphile-keyed", peer: "graphile", keys: O.keys },
    { key: "pgboss-keyed", peer: "pgboss", keys: O.keys },
  ] as const;
  const perKey = O.rows / O.keys;
  for (let r = 0; r < runs; r++) {
    for (const c of CONCURRENCIES) {
      for (const sys of systems) {
        // pg-boss's key_strict_fifo drains a few hundred rows/s: one capped run, not a full drain per run.
        const capped = sys.key === "pgboss-keyed";
        if (capped && r > 0) continue;
        add(
          drains,
          `${sys.key}:${c}`,
          await job<DrainResult>({
            kind: "drain",
            peer: sys.peer,
            concurrency: c,
            rows: O.rows,
            ...(sys.keys ? { keys: sys.keys } : {}),
            ...(capped ? { maxSeconds: O.cappedSeconds } : {}),
          }),
        );
      }
    }
    // The hot and parked jobs twice a run: each is a ~2 s drain, and on a shared 2-core VM three pairs of
    // them spread 0.73–1.25× between runs, too wide to read a 0.9× target from.
    for (const [hotRows, parked, into] of [
      ...Array.from({ length: HOT_PAIRS_PER_RUN }, () => [
        [O.hotRows, false, hot] as const,
        [O.hotRows, true, parkedHot] as const,
      ]).flat(),
      [0, false, cold] as const,
    ]) {
      into.push(
        await job<HotKeyResult>({
          kind: "hotKey",
          concurrency: SCALE_CONCURRENCY,
          hotRows,
          keys: O.keys,
          perKey,
          hotSeconds: O.hotSeconds,
          ...(parked ? { parked } : {}),
        }),
      );
    }
    for (const keys of [0, O.scaleKeys]) {
      add(
        scales,
        String(keys),
        await job<KeyScaleResult>({ kind: "keyScale", rows: O.scaleRows, keys, timed: P.timed }),
      );
    }
    for (const mode of ["default", "keyed"]) {
      add(
        produced,
        mode,
        await job<ProducerResult>({
          kind: "producer",
          peer: "outbox",
          mode,
          clients: CLIENTS,
          seconds: O.producerSeconds,
        }),
      );
    }
  }

  say("## 6. Per-key ordering");
  say();
  say(
    `Command: \`${command}\`. Rows with a key are leased only while they head their (queue, key): the fetch reads ` +
      "`messages_due_idx` (heads only), and an ack or dead-letter move of a head promotes the oldest row " +
      "left of its key, leasing it to the same worker when it has room (a hand-off), in one call of the " +
      "`ack_key_heads` function, which tries the key's advisory lock. Keyed fills write the rows in one " +
      "statement with `head` set as the key-head trigger sets it (trigger disabled for the fill: one statement " +
      "over thousands of keys would hold one advisory lock per key; the trigger's cost is the producer row below); " +
      "keys interleave in id order (row n has key n mod keys), like real traffic.",
  );
  say();

  say(`### 6a. Drain: ${fmt(O.rows)} rows keyless vs over ${fmt(O.keys)} keys (${fmt(perKey)} per key)`);
  say();
  say(
    "As section 1 (one worker process, no-op handler, rows/s from the first handler start until the table is " +
      "empty), default options but the concurrency. Peers with their own per-key FIFO: graphile-worker a named " +
      "queue (`queueName`) per key (its named queues run one job at a time, in order), pg-boss a queue with " +
      "`policy: 'key_strict_fifo'` and the key as `singletonKey` (one run only, and stopped after " +
      `${O.cappedSeconds} s if rows are left then: its rate is then rows handled ÷ time, marked in the row); their keyless drains are section 1's. ` +
      '"order violations": handler starts that came before an earlier row of their key (must be 0).',
  );
  say();
  const label: Record<(typeof systems)[number]["key"], string> = {
    outbox: `${LABEL.outbox}, keyless`,
    "outbox-keyed": `${LABEL.outbox}, ${fmt(O.keys)} keys`,
    "graphile-keyed": `${LABEL.graphile}, ${fmt(O.keys)} named queues`,
    "pgboss-keyed": `${LABEL.pgboss}, \`key_strict_fifo\`, ${fmt(O.keys)} singleton keys`,
  };
  const drainRows: string[][] = [];
  for (const c of CONCURRENCIES) {
    for (const sys of systems) {
      const xs = drains.get(`${sys.key}:${c}`);
      const cut = (xs ?? []).find((x) => x.partial !== undefined);
      const note = cut ? ` (stopped after ${O.cappedSeconds} s, ${fmt(cut.partial ?? 0)} rows handled)` : "";
      drainRows.push([...drainRow(`${label[sys.key]}, concurrency ${c}${note}`, xs), orderCell(xs)]);
    }
  }
  table(
    [
      "system",
      "rows/s",
      "CPU µs/msg, worker",
      "CPU µs/msg, rest (Postgres)",
      "statements/msg",
      "order violations",
    ],
    drainRows,
  );
  const rate = (key: string) => (drains.get(key) ?? []).map((x) => x.rate);
  const ratioRows: string[][] = [];
  for (const c of CONCURRENCIES) {
    const ordered = rate(`outbox-keyed:${c}`);
    const own = ratio(ordered, rate(`outbox:${c}`));
    ratioRows.push([
      `concurrency ${c}`,
      own.text,
      ratio(ordered, rate(`graphile-keyed:${c}`)).text,
      ratio(ordered, rate(`pgboss-keyed:${c}`)).text,
    ]);
    targets.push({
      what: `ordered drain (${fmt(O.rows)} rows, ${fmt(O.keys)} keys) ≥ 0.8× the keyless drain (concurrency ${c})`,
      measured: own.text,
      holds: own.value >= 0.8,
    });
  }
  say("Ratios, this project over keys ÷ each:");
  say();
  table(
    ["", "÷ this project keyless", "÷ graphile-worker named queues", "÷ pg-boss key_strict_fifo"],
    ratioRows,
  );

  say(
    `### 6b. One hot key: ${fmt(O.hotRows)} rows of one key among ${fmt(O.keys)} other keys × ${fmt(perKey)}`,
  );
  say();
  say(
    `One worker (default options, concurrency ${SCALE_CONCURRENCY}) on ${fmt(O.hotRows)} rows of key "hot" interleaved ` +
      `in id order with ${fmt(O.keys * perKey)} rows of ${fmt(O.keys)} other keys. The other keys' drain (first handler ` +
      "start until none of their rows is left) is compared with the same table whose hot-key rows are parked in a " +
      "queue no worker serves (its own job: the same table and indexes, so the difference is the hot key's own " +
      `cost; ${HOT_PAIRS_PER_RUN} pairs of the two per run, interleaved: single pairs of these short drains are noisy on a ` +
      "shared VM), and with the other keys' rows alone (a table a third the size). Then the hot key alone is watched " +
      `for ${O.hotSeconds} s: rows/s, the time between two of its handler ` +
      "starts, and the worker's statements in that window (client side, medians).",
  );
  say();
  const hv = (f: (h: HotKeyResult) => number, digits = 0, xs = hot) => mr(xs.map(f), digits);
  const withHot = hot.map((h) => h.otherRate);
  const withoutHot = cold.map((h) => h.otherRate);
  // Each run's cold job pairs with both of its hot jobs (repeating it leaves its median as it was).
  const speed = ratio(
    withHot,
    withoutHot.flatMap((x) => Array<number>(HOT_PAIRS_PER_RUN).fill(x)),
  );
  const sameTable = ratio(
    withHot,
    parkedHot.map((h) => h.otherRate),
  );
  const stmt = (label: string) => (h: HotKeyResult) => h.statementMs[label] ?? Number.NaN;
  const cycle = hot.map((h) => (h.statementMs.lease ?? 0) + (h.statementMs.ack ?? 0));
  table(
    ["", "value"],
    [
      [`other keys' rows/s, hot key present`, hv((h) => h.otherRate)],
      [
        `other keys' rows/s, the hot key's rows parked in another queue`,
        hv((h) => h.otherRate, 0, parkedHot),
      ],
      [`other keys' rows/s, no hot-key rows at all`, hv((h) => h.otherRate, 0, cold)],
      ["ratio, hot key present ÷ parked (same table)", sameTable.text],
      ["ratio, hot key present ÷ no hot-key rows (a third the size)", speed.text],
      ["hot-key rows/s while the other keys drain", hv((h) => h.hotRateMixed, 1)],
      ["hot-key rows/s alone", hv((h) => h.hotRateAlone, 1)],
      ["ms between two hot-key handler starts, alone", hv((h) => h.hotGapMs, 1)],
      ["lease statements per hot-key row, alone", hv((h) => h.leasesPerHotRow, 2)],
      ["fetch ms (lease statement), alone", hv(stmt("lease"), 2)],
      [
        "keyed ack ms (`ack_key_heads`: completion, promotion and hand-off in one call), alone",
        hv(stmt("ack"), 2),
      ],
      ["fetch + keyed ack ms", mr(cycle, 2)],
      [
        "rows/s those statements allow one key (1000 ÷ that sum)",
        mr(
          cycle.map((x) => 1000 / x),
          0,
        ),
      ],
      [
        "order violations (hot key and the others)",
        String(Math.max(...[...hot, ...parkedHot, ...cold].map((h) => h.orderViolations))),
      ],
    ],
  );
  const hotPlans = hot[0]?.plans ?? [];
  say(
    `Plans at ${fmt(O.hotRows + O.keys * perKey)} rows (hot key present, first run), as in section 4: \`EXPLAIN (ANALYZE)\` of the prepared ` +
      "fetch (lease 500), keyed ack of 500 leased heads and the promotion of their successors, custom and generic plans, rolled back:",
  );
  say();
  table(
    ["rows", "statement", "plan", "scans (node types, indexes)", "execution ms", "index plan"],
    hotPlans.map((p) => [fmt(p.rows), p.statement, p.mode, p.scans, fmt(p.ms, 2), p.ok ? "yes" : "**no**"]),
  );
  const hotFetchPlans = hot.flatMap((h) => h.plans.filter((p) => p.statement === "fetch"));
  const bounded = hotFetchPlans.every(
    (p) => p.ok && p.scans.includes("messages_due_idx") && !/Seq Scan/.test(p.scans),
  );
  const violations = Math.max(...[...hot, ...parkedHot, ...cold].map((h) => h.orderViolations));
  targets.push({
    what: `hot key (${fmt(O.hotRows)} rows) + ${fmt(O.keys)} keys: fetch index-bounded (messages_due_idx, no Seq Scan, every run, custom and generic) and the other keys drain at full speed (≥ 0.9× the same table with the hot key's rows parked in a queue no worker serves; ÷ a table without them: reported), hot key one at a time in order`,
    measured: `${hotFetchPlans.filter((p) => p.ok).length} of ${hotFetchPlans.length} fetch plans index-only; ${sameTable.text} (÷ no hot-key rows: ${speed.text}); ${violations} order violations`,
    holds: bounded && sameTable.value >= 0.9 && violations === 0,
  });

  const aloneVsStatements = ratio(
    hot.map((h) => h.hotRateAlone),
    cycle.map((x) => 1000 / x),
  );
  targets.push({
    what: "hot key alone proceeds at ≈ 1 ÷ (handler + completion): ≥ 0.5× the rate its fetch and keyed ack statements allow one key",
    measured: `${hv((h) => h.hotRateAlone, 1)} rows/s, ${aloneVsStatements.text} of ${mr(
      cycle.map((x) => 1000 / x),
      0,
    )}`,
    holds: aloneVsStatements.value >= 0.5,
  });

  say(`### 6c. Fetch at ${fmt(O.scaleRows)} rows: keyless vs ${fmt(O.scaleKeys)} keys`);
  say();
  say(
    `As section 4's isolated timings: ${fmt(O.scaleRows)} rows, keyless or every row keyed over ${fmt(O.scaleKeys)} keys ` +
      `(${fmt(O.scaleRows / O.scaleKeys)} per key, so ${fmt(O.scaleKeys)} heads); ${P.timed} rounds per N of "lease N with the fetch ` +
      `statement, then complete them" on one connection, prepared, as the worker runs them; the keyed completion is ` +
      "one call of the `ack_key_heads` function (completion and promotion, no hand-off: the next round's fetch leases the new heads), the keyless one the `ack` statement.",
  );
  say();
  const sv = (keys: number, f: (s: KeyScaleResult) => number) => (scales.get(String(keys)) ?? []).map(f);
  const cell = (keys: number, which: "timedFetch" | "timedAck", limit: number, q: "p50" | "p99") =>
    sv(keys, (s) => s[which].find((t) => t.limit === limit)?.[q] ?? Number.NaN);
  const scaleRows: string[][] = [];
  for (const [which, name] of [
    ["timedFetch", "fetch, lease"],
    ["timedAck", "completion of"],
  ] as const) {
    for (const limit of [100, OUR_BATCH]) {
      scaleRows.push([
        `${name} ${limit}`,
        mr(cell(0, which, limit, "p50"), 2),
        mr(cell(0, which, limit, "p99"), 2),
        mr(cell(O.scaleKeys, which, limit, "p50"), 2),
        mr(cell(O.scaleKeys, which, limit, "p99"), 2),
        ratio(cell(O.scaleKeys, which, limit, "p50"), cell(0, which, limit, "p50")).text,
      ]);
    }
  }
  table(
    [
      `at ${fmt(O.scaleRows)} rows`,
      "keyless p50 ms",
      "keyless p99 ms",
      `${fmt(O.scaleKeys)} keys p50 ms`,
      `${fmt(O.scaleKeys)} keys p99 ms`,
      "p50 keyed ÷ keyless",
    ],
    scaleRows,
  );
  const keyedPlans = scales.get(String(O.scaleKeys))?.[0]?.plans ?? [];
  const keylessPlans = scales.get("0")?.[0]?.plans ?? [];
  const scalePlans = [...keyedPlans, ...keylessPlans];
  say("Plans (first run; keyed, then keyless):");
  say();
  table(
    ["rows", "statement", "plan", "scans (node types, indexes)", "execution ms", "index plan"],
    scalePlans.map((p) => [fmt(p.rows), p.statement, p.mode, p.scans, fmt(p.ms, 2), p.ok ? "yes" : "**no**"]),
  );
  const jit = (plans: PlanCheck[], what: string) =>
    plans.filter((p) => p.scans.includes("JIT")).map((p) => `the ${what} ${p.mode} ${p.statement} plan`);
  const jitted = [...jit(keyedPlans, "keyed"), ...jit(keylessPlans, "keyless")];
  if (jitted.length) {
    say(
      `JIT: ${jitted.join(", ")} was JIT-compiled, as in section 4: its execution time is mostly the compilation, ` +
        "and with `plan_cache_mode = auto` the worker keeps the custom plan.",
    );
    say();
  }
  const fetchRatio = ratio(
    cell(O.scaleKeys, "timedFetch", OUR_BATCH, "p50"),
    cell(0, "timedFetch", OUR_BATCH, "p50"),
  );
  targets.push({
    what: `fetch p50 at ${fmt(O.scaleRows)} rows with ${fmt(O.scaleKeys)} keys ≤ 2× the keyless fetch (lease ${OUR_BATCH}, the default batchSize)`,
    measured: fetchRatio.text,
    holds: fetchRatio.value <= 2,
  });

  say("### 6d. Producer: keyed vs keyless `publish`");
  say();
  say(
    `As section 3: ${CLIENTS} clients, ${O.producerSeconds} s, \`BEGIN; publish(); COMMIT\` with the default throttled wake-ups; ` +
      `keyed: message n with key \`k<n mod ${fmt(PRODUCER_KEYS)}>\` (the key's advisory lock before the id is drawn, and the key-head ` +
      "trigger: the same lock again, an index probe for a row of the key, and, the key having rows (all but the first " +
      `${fmt(PRODUCER_KEYS)} publishes here), a second for a row above the new id: \`below_head\`, migration 0007).`,
  );
  say();
  const tx = (mode: string) => (produced.get(mode) ?? []).map((x) => x.txPerSec);
  table(
    ["producer", "tx/s", "÷ keyless"],
    [
      ["this project: `publish`, keyless", mr(tx("default")), "1.00×"],
      [
        `this project: \`publish\` with a key (${fmt(PRODUCER_KEYS)} keys)`,
        mr(tx("keyed")),
        ratio(tx("keyed"), tx("default")).text,
      ],
    ],
  );
}

// ------------------------------------------------------------------------------------------ follow-ups

/**
 * What follow-up messages cost the drain (bench/follow-ups.ts, in a process of its own after the machine
 * is quiet): parents/s with one follow-up each against parents/s with none, as a ratio of medians.
 */
async function followUpsSection() {
  const rows = P.drainRows;
  for (const deadline = Date.now() + 180_000; Date.now() < deadline; ) {
    const b = await busy();
    if (b < QUIET) break;
    progress(`machine busy (${b.toFixed(2)} CPU-s/s) before the follow-up drains: waiting`);
  }
  const args = ["--rows", String(rows), "--runs", String(runs), "--concurrency", "10", "--json"];
  progress(`follow-ups ${args.join(" ")}`);
  const output = execFileSync(process.execPath, ["--import", "tsx", "bench/follow-ups.ts", ...args], {
    cwd: ROOT,
    encoding: "utf8",
    env: { ...process.env, DATABASE_URL },
  });
  const results = JSON.parse(output.trim().split("\n").at(-1) ?? "[]") as FollowUpResult[];
  const byMode = new Map(results.map((r) => [r.mode, r]));
  say("## Follow-up messages: what they cost the drain");
  say();
  say(
    `Command: \`node --import tsx bench/follow-ups.ts ${args.filter((a) => a !== "--json").join(" ")}\`. ${fmt(rows)} parent rows, ` +
      "one worker (concurrency 10, batchSize 500); time until every parent is acknowledged. `one`: each handler returns " +
      "one follow-up to a queue the worker does not serve (the ack deletes the parent and inserts the follow-up in one " +
      "statement); `served`: the worker serves the follow-ups too, so each parent is two messages of work; `keyed-*`: " +
      "every parent has its own key (the keyed ack, and the follow-up insert in the same statement). Ratios against " +
      "`none` (`keyed-none` for keyed modes) of the same run.",
  );
  say();
  table(
    ["mode", "parents/s (median)", "range", "ratio vs no follow-ups", "worker CPU µs/parent"],
    results.map((x) => {
      const base = byMode.get(x.mode.startsWith("keyed") ? "keyed-none" : "none");
      return [
        x.mode,
        fmt(median(x.rates)),
        range(x.rates),
        base && base !== x ? ratio(x.rates, base.rates).text : "1.00",
        median(x.cpuUs).toFixed(1),
      ];
    }),
  );
}

/**
 * Ack latency of parents whose follow-ups share a few keys, with two workers (bench/follow-up-keys.ts, in a
 * process of its own: each worker a child process), issue 26.5. Several runs: how the two workers' batches
 * interleave differs run by run, so the spread is part of the figure.
 */
async function followUpKeysSection() {
  const rows = quick ? 5_000 : 20_000;
  const keyRuns = Math.max(runs, 5);
  const args = ["--rows", String(rows), "--keys", "50", "--runs", String(keyRuns), "--json"];
  progress(`follow-up keys ${args.join(" ")}`);
  const output = execFileSync(process.execPath, ["--import", "tsx", "bench/follow-up-keys.ts", ...args], {
    cwd: ROOT,
    encoding: "utf8",
    env: { ...process.env, DATABASE_URL },
  });
  const results = JSON.parse(output.trim().split("\n").at(-1) ?? "[]") as FollowUpKeyResult[];
  say("## Follow-up messages on shared keys: ack latency with two workers");
  say();
  say(
    `Command: \`node --import tsx bench/follow-up-keys.ts ${args.filter((a) => a !== "--json").join(" ")}\`. ${fmt(rows)} parent rows ` +
      "up front, each worker a child process (`createWorker`, concurrency 10, defaults), each handler returns one follow-up " +
      "to a queue no worker serves; each run waits for an idle machine first. Ack latency: from the handler's return to " +
      "the worker's `acked` event. `keyless`: the follow-ups have no key; `keyed`: follow-up n has key `k<n % 50>`; " +
      "`keyed-1w`: the same with one worker; `keyed-parents`: as `keyed`, each parent with a key of its own. " +
      `Per mode, the median of ${keyRuns} runs and their range; busy answers: deliveries answered busy (a key lock held ` +
      "elsewhere) per parent.",
  );
  say();
  table(
    ["mode", "workers", "ack p50 ms", "ack p99 ms", "ack max ms", "parents/s", "busy answers per parent"],
    results.map((x) => [
      x.mode,
      x.mode === "keyed-1w" ? "1" : "2",
      mr(x.p50),
      mr(x.p99),
      mr(x.max),
      mr(x.rates),
      mr(x.busy, 2),
    ]),
  );
  const keyed = results.find((x) => x.mode === "keyed");
  if (keyed) {
    const worst = Math.max(...keyed.p99);
    targets.push({
      what: "follow-ups on 50 shared keys, two workers: ack p99 ≤ 1 s in every run",
      measured: `${fmt(worst)} ms (worst run)`,
      holds: worst <= 1000,
    });
  }
}

// ------------------------------------------------------------------------------------------ tx handler

/**
 * What a handler that commits with its ack costs (bench/tx-handler.ts, in a process of its own after the
 * machine is quiet): messages/s of a handler writing one effect row in its ack's transaction against the
 * same handler writing through a pool with batched acks, as a ratio of medians.
 */
async function txHandlerSection() {
  const rows = quick ? 2_000 : 20_000;
  for (const deadline = Date.now() + 180_000; Date.now() < deadline; ) {
    const b = await busy();
    if (b < QUIET) break;
    progress(`machine busy (${b.toFixed(2)} CPU-s/s) before the transactional-handler drains: waiting`);
  }
  const args = ["--rows", String(rows), "--runs", String(runs), "--concurrency", "10", "--json"];
  progress(`tx-handler ${args.join(" ")}`);
  const output = execFileSync(process.execPath, ["--import", "tsx", "bench/tx-handler.ts", ...args], {
    cwd: ROOT,
    encoding: "utf8",
    env: { ...process.env, DATABASE_URL },
  });
  const results = JSON.parse(output.trim().split("\n").at(-1) ?? "[]") as TxHandlerResult[];
  const byMode = new Map(results.map((r) => [r.mode, r]));
  say("## Handlers that commit with their ack: what the transaction costs");
  say();
  say(
    `Command: \`node --import tsx bench/tx-handler.ts ${args.filter((a) => a !== "--json").join(" ")}\`. ${fmt(rows)} messages, ` +
      "one worker (concurrency 10); each handler inserts one effect row. `batched`: through a pool of its own, acks " +
      "batched by the worker; `transaction`: `handleInTransaction`, the effect row, the ack and the COMMIT in one " +
      "transaction per message on a held connection; `keyed-*`: every message has its own key. Ratios against the " +
      "batched mode of the same keying.",
  );
  say();
  table(
    ["mode", "messages/s (median)", "range", "ratio vs batched"],
    results.map((x) => {
      const base = byMode.get(x.mode.startsWith("keyed") ? "keyed-batched" : "batched");
      return [
        x.mode,
        fmt(median(x.rates)),
        range(x.rates),
        base && base !== x ? ratio(x.rates, base.rates).text : "1.00",
      ];
    }),
  );
}

// ------------------------------------------------------------------------------------------------ run

const drain = only.includes("drain") ? await drainSection() : undefined;
if (only.includes("latency")) await latencySection();
if (only.includes("producer")) await producerSection();
const scale = only.includes("scale") ? (await scaleSection(drain)).results : undefined;
if (drain || scale) roundTripSection(drain, scale);
if (only.includes("ordering")) await orderingSection();
if (only.includes("followups")) {
  await followUpsSection();
  await followUpKeysSection();
}
if (only.includes("txhandler")) await txHandlerSection();

say("## Settings per system");
say();
const boss10 = pgbossTuning(10);
const boss32 = pgbossTuning(32);
table(
  ["system", "settings"],
  [
    [
      "pg-outbox-worker",
      `\`createWorker({ concurrency })\`: default options everywhere (batchSize ${OUR_BATCH}, adaptive: a fetch starts at max(concurrency, 10) rows and doubles while full; local prefetch bounded by handler time), so its own sessions commit with \`synchronous_commit = off\`; one drain and one latency row with \`synchronousCommit: true\` wait for the flush like the peers (server default, on). Own pool of 6 plus the LISTEN connection.`,
    ],
    [
      `graphile-worker ${versions.graphile}`,
      `\`run({ preset: { worker: { concurrentJobs, maxPoolSize: max(10, concurrency + 2), localQueue: { size: ${GRAPHILE_LOCAL_QUEUE} }, completeJobBatchDelay: 0, failJobBatchDelay: 0 } } })\`: the configuration of its performance page (https://worker.graphile.org/docs/performance). Fill with \`addJobs\`.`,
    ],
    [
      `pg-boss ${versions.pgboss}`,
      `\`work(queue, { batchSize: ${boss10.batchSize}, localConcurrency: min(concurrency, 4), burstWhenBatchFull: true })\` (concurrency 10 → ${boss10.localConcurrency}, 32 → ${boss32.localConcurrency}; the best of batchSize 100–1000 × localConcurrency 1–10 tried on this machine), pool max(10, localConcurrency + 2); \`useListenNotify\` + queue \`notify: true\` for wake-ups. Fill with \`insert\`.`,
    ],
    [
      "SQL ceilings",
      `N plain pg connections looping until the queue is empty, ${SQL_BATCH} rows per round trip, on this project's table and indexes: see bench/peers/sql.ts.`,
    ],
  ],
);

say("## Targets");
say();
table(
  ["target", "measured", "holds"],
  targets.map((t) => [t.what, t.measured, t.holds ? "yes" : "**no**"]),
);

say("## Versions");
say();
say(
  `graphile-worker ${versions.graphile} and pg-boss ${versions.pgboss} declare \`engines.node\` ">=22.18.0" and ">=22.12.0". ` +
    "They are installed in bench/ anyway (npm only warns, EBADENGINE) and run unmodified on Node " +
    `${process.version}: every bench above exercises their worker, enqueue and batch paths, and neither uses an API ` +
    "Node 20 lacks (checked: no `Promise.withResolvers`, `Array.fromAsync`, Set methods, `process.getBuiltinModule`; " +
    "`Symbol.asyncDispose` and `AbortSignal.any` exist in Node 20). So all three systems ran on the same Node, and the " +
    "npm `node@22` fallback was not needed.",
);
say();
say(`Total time: ${elapsed()}; jobs repeated because the machine was busy right after them: ${repeated}.`);

// A hand-written analysis of the figures (what limits the ones that miss) survives a rerun: it is kept from
// the previous file between these markers, to be reread against the new figures.
const NOTES = /<!-- notes:start -->[\s\S]*<!-- notes:end -->/;
const notes = existsSync(out) ? NOTES.exec(readFileSync(out, "utf8"))?.[0] : undefined;
if (notes) md.push("", notes);
writeFileSync(out, `${md.join("\n")}\n`);
// The repository's formatter pads markdown tables; format the file so `npm run lint` stays clean.
try {
  execFileSync("npx", ["biome", "format", "--write", out], { cwd: ROOT, stdio: "ignore" });
} catch {
  progress(`could not format ${out} with biome; left as written`);
}
progress(`wrote ${out}`);
