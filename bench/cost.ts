/**
 * "Postgres cost per message": what delivering a message costs the database, for this project, its own
 * earlier version (optional), graphile-worker, pg-boss and the SQL floor, side by side in one run.
 *
 * Drain: `--rows` rows (~100-byte payloads) filled, VACUUM ANALYZE and CHECKPOINT, then drained by one
 * worker at default options (concurrency 10); WAL bytes, full-page images, Postgres and worker CPU, HOT
 * updates, dead tuples left, pages read and index pages written, per delivered message (bench/pg-cost.ts).
 * `--runs` runs interleaved, medians. Steady: `--steady-rate` messages a second for `--steady-minutes`
 * minutes, autovacuum off and on, table and index sizes and pickup latency at the start and the end.
 *
 * Pickup and producers (`--pickup-runs N`, needs `--before`): pickup latency with LISTEN and poll-only,
 * and producer transactions a second beside the unnamed INSERT, this checkout against the older one,
 * interleaved: what the change costs the paths that neither drain nor steady traffic measures.
 *
 *   npx tsx bench/cost.ts --runs 3 [--before /path/to/older/checkout] [--steady-minutes 10] [--systems outbox,graphile]
 *   npx tsx bench/cost.ts --runs 0 --pickup-runs 3 --before /path/to/older/checkout
 *
 * Prints markdown. Each job starts only on an idle machine (< 0.25 CPU-seconds a second).
 */
import type { DrainResult, JobSpec, LatencyResult, PeerName, ProducerResult, SteadyResult } from "./job.js";
import { arg, fmt, machineCpuSeconds, median, range, runJob, sleep } from "./lib.js";

const runs = Number(arg("runs", "3"));
const rows = Number(arg("rows", "50000"));
const before = arg("before", "");
const steadyMinutes = Number(arg("steady-minutes", "0"));
const steadyRate = Number(arg("steady-rate", "500"));
const pickupRuns = Number(arg("pickup-runs", "0"));
// Which autovacuum settings the steady runs take, in order: "off,on" (both), or one of them.
const steadyAutovacuum = arg("autovacuum", "off,on")
  .split(",")
  .map((v) => {
    if (v !== "off" && v !== "on") throw new Error(`--autovacuum: off, on or off,on, got ${v}`);
    return v === "on";
  });
const systems = arg("systems", "outbox,outbox-keyed,graphile,pgboss,floor,lease-ack").split(",");
const KEYS = 10_000;

async function quiet(): Promise<void> {
  for (const deadline = Date.now() + 180_000; Date.now() < deadline; ) {
    const a = machineCpuSeconds();
    await sleep(1000);
    if (machineCpuSeconds() - a < 0.25) return;
    process.stderr.write("machine busy: waiting\n");
  }
}

async function job<T>(spec: JobSpec, cwd?: string): Promise<T> {
  await quiet();
  process.stderr.write(`${cwd ? `[${cwd}] ` : ""}${JSON.stringify(spec)}\n`);
  return runJob<T>(spec, { timeoutMs: 3_600_000, ...(cwd ? { cwd } : {}) });
}

interface System {
  key: string;
  label: string;
  run(): Promise<DrainResult>;
}

const drainOf =
  (peer: PeerName, extra: Partial<Extract<JobSpec, { kind: "drain" }>> = {}, cwd?: string) =>
  () =>
    job<DrainResult>({ kind: "drain", peer, concurrency: 10, rows, ...extra }, cwd);

const all: System[] = [
  { key: "outbox", label: "pg-outbox-worker (defaults)", run: drainOf("outbox") },
  {
    key: "outbox-keyed",
    label: `pg-outbox-worker, ordered over ${fmt(KEYS)} keys`,
    run: drainOf("outbox", { keys: KEYS }),
  },
  {
    key: "outbox-tx",
    label: 'pg-outbox-worker, leaseMode "transaction"',
    run: drainOf("outbox", { tuning: { leaseTransaction: 1 } }),
  },
  {
    key: "outbox-tx-keyed",
    label: `pg-outbox-worker, leaseMode "transaction", ordered over ${fmt(KEYS)} keys`,
    run: drainOf("outbox", { keys: KEYS, tuning: { leaseTransaction: 1 } }),
  },
  { key: "graphile", label: "graphile-worker (batched)", run: drainOf("graphile") },
  { key: "pgboss", label: "pg-boss (batch fetch)", run: drainOf("pgboss") },
  {
    key: "floor",
    label: "SQL floor: one `DELETE … RETURNING` of 500 per round trip, 1 connection",
    run: () => job<DrainResult>({ kind: "sql", variant: "lease-delete", connections: 1, rows }),
  },
  {
    key: "floor2",
    label: "SQL floor, 2 connections",
    run: () => job<DrainResult>({ kind: "sql", variant: "lease-delete", connections: 2, rows }),
  },
  {
    key: "lease-ack",
    label: "SQL: our fetch then our fenced ack, 2 connections, no worker",
    run: () => job<DrainResult>({ kind: "sql", variant: "lease-ack", connections: 2, rows }),
  },
];
if (before) {
  all.splice(
    2,
    0,
    { key: "before", label: "pg-outbox-worker before (defaults)", run: drainOf("outbox", {}, before) },
    {
      key: "before-keyed",
      label: `pg-outbox-worker before, ordered over ${fmt(KEYS)} keys`,
      run: drainOf("outbox", { keys: KEYS }, before),
    },
  );
}
const chosen = all.filter(
  (s) =>
    systems.includes(s.key) ||
    (s.key === "floor2" && systems.includes("floor")) ||
    (s.key.startsWith("before") && systems.includes(s.key.replace("before", "outbox"))),
);

const results = new Map<string, DrainResult[]>();
for (let r = 0; r < runs; r++) {
  for (const s of chosen) results.set(s.key, [...(results.get(s.key) ?? []), await s.run()]);
}

const per = (xs: number[], n: number) => xs.map((x) => x / n);
const mr = (xs: number[], digits = 0) => `${fmt(median(xs), digits)} (${range(xs, digits)})`;
const out: string[] = [];
// --runs 0: the steady runs alone.
if (runs > 0) drainTables();

function drainTables(): void {
  out.push(
    `Drain of ${fmt(rows)} rows, ${runs} runs each, median (range). Per delivered message: WAL bytes (of which full-page images), Postgres CPU µs (the machine minus the worker process), worker CPU µs, dead tuples left, heap and index pages read; HOT = HOT updates ÷ updates; index pages written = distinct index pages in the drain's WAL, per 1,000 messages.`,
    "",
    "| system | rows/s | WAL B/msg | of which FPI | Postgres CPU µs/msg | worker CPU µs/msg | HOT / updates | dead tuples/msg | heap pages read/msg | index pages read/msg | index pages written /1k msg |",
    "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
  );
  for (const s of chosen) {
    const rs = results.get(s.key) ?? [];
    const c = (f: (r: DrainResult) => number) => rs.map(f);
    const cost = (f: (k: NonNullable<DrainResult["cost"]>) => number) =>
      rs.map((r) => (r.cost ? f(r.cost) : Number.NaN));
    const hot = median(cost((k) => k.hotUpdates));
    const upd = median(cost((k) => k.updates));
    out.push(
      `| ${s.label} | ${mr(c((r) => r.rate))} | ${mr(
        per(
          cost((k) => k.walBytes),
          rows,
        ),
      )} | ${fmt(
        median(
          per(
            cost((k) => k.fpiBytes),
            rows,
          ),
        ),
      )} | ${mr(
        c((r) => r.cpuRest),
        1,
      )} | ${mr(
        c((r) => r.cpuNode),
        1,
      )} | ${upd > 0 ? `${fmt(hot)} / ${fmt(upd)}` : "no updates"} | ${fmt(
        median(
          per(
            cost((k) => k.deadTuples),
            rows,
          ),
        ),
        2,
      )} | ${fmt(
        median(
          per(
            cost((k) => k.heapPagesRead),
            rows,
          ),
        ),
        2,
      )} | ${fmt(
        median(
          per(
            cost((k) => k.indexPagesRead),
            rows,
          ),
        ),
        2,
      )} | ${fmt(
        median(
          per(
            cost((k) => k.indexPagesWritten),
            rows / 1000,
          ),
        ),
        1,
      )} |`,
    );
  }
  const med = (key: string, f: (r: DrainResult) => number) => median((results.get(key) ?? []).map(f));
  const wal = (k: string) => med(k, (r) => (r.cost?.walBytes ?? Number.NaN) / rows);
  // The one-statement ceiling: the faster of the floor's 1 and 2 connections.
  const ceiling = Math.max(
    med("floor", (r) => r.rate),
    results.has("floor2") ? med("floor2", (r) => r.rate) : 0,
  );
  if (results.has("outbox") && results.has("floor")) {
    out.push(
      "",
      `WAL ÷ floor: ${(wal("outbox") / wal("floor")).toFixed(2)}×${results.has("before") ? ` (before: ${(wal("before") / wal("floor")).toFixed(2)}×)` : ""}; drain ÷ one-statement ceiling (faster of 1 and 2 connections): ${(med("outbox", (r) => r.rate) / ceiling).toFixed(2)}×${results.has("before") ? ` (before: ${(med("before", (r) => r.rate) / ceiling).toFixed(2)}×)` : ""}.`,
    );
  }
  if (results.has("outbox") && results.has("graphile"))
    out.push(
      `Drain ÷ graphile-worker: ${(med("outbox", (r) => r.rate) / med("graphile", (r) => r.rate)).toFixed(2)}×.`,
    );
  if (results.has("outbox") && results.has("outbox-keyed"))
    out.push(
      `Ordered ÷ keyless: ${(med("outbox-keyed", (r) => r.rate) / med("outbox", (r) => r.rate)).toFixed(2)}×${results.has("before-keyed") ? ` (before: ${(med("before-keyed", (r) => r.rate) / med("before", (r) => r.rate)).toFixed(2)}×)` : ""}.`,
    );
  if (results.has("outbox-tx") && results.has("floor")) {
    const graphile = results.has("graphile")
      ? `; ÷ graphile-worker ${(med("outbox-tx", (r) => r.rate) / med("graphile", (r) => r.rate)).toFixed(2)}×`
      : "";
    const keyed = results.has("outbox-tx-keyed")
      ? `; ordered ÷ keyless ${(med("outbox-tx-keyed", (r) => r.rate) / med("outbox-tx", (r) => r.rate)).toFixed(2)}×`
      : "";
    out.push(
      `leaseMode "transaction": WAL ÷ floor ${(wal("outbox-tx") / wal("floor")).toFixed(2)}×; drain ÷ ceiling ${(med("outbox-tx", (r) => r.rate) / ceiling).toFixed(2)}×${graphile}${keyed}.`,
    );
  }
}

if (steadyMinutes > 0) {
  const peers: { key: string; peer: PeerName; cwd?: string }[] = [
    { key: "outbox", peer: "outbox" as const },
    ...(before ? [{ key: "before", peer: "outbox" as const, cwd: before }] : []),
    { key: "graphile", peer: "graphile" as const },
    { key: "pgboss", peer: "pgboss" as const },
  ].filter((p) => systems.includes(p.key) || (p.key === "before" && systems.includes("outbox")));
  out.push(
    "",
    `Steady traffic: ${fmt(steadyRate)} single-message producer transactions a second for ${steadyMinutes} min, one worker at defaults (concurrency 10) taking them; sizes at the end of the first and the last minute, pickup latency (commit returned → handler start) of the messages committed in that minute, per message over the run: WAL bytes and Postgres CPU (producers' and worker's statements together).`,
    "",
    "| system | autovacuum | table+index MB, 1st min | table+index MB, last min | dead tuples, last min | pickup p50 / p99 ms, 1st min | pickup p50 / p99 ms, last min | WAL B/msg | Postgres CPU µs/msg | autovacuum runs |",
    "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
  );
  for (const av of steadyAutovacuum) {
    for (const p of peers) {
      // pg-boss's send is slower per call: with 4 connections its sends fell behind 500/s until they timed
      // out waiting for a connection, so it gets 8 (the rate is what is compared, not the pool).
      const producers = p.peer === "pgboss" ? 8 : 4;
      let r: SteadyResult;
      try {
        r = await job<SteadyResult>(
          {
            kind: "steady",
            peer: p.peer,
            rate: steadyRate,
            seconds: steadyMinutes * 60,
            autovacuum: av,
            windowSeconds: 60,
            producers,
          },
          p.cwd,
        );
      } catch (error) {
        // One system failing must not lose the rows the others took minutes to produce.
        const line = `| ${p.key} | ${av ? "on" : "off"} | failed: ${String(error).split("\n")[0]} |`;
        out.push(line);
        process.stderr.write(`${line}\n`);
        continue;
      }
      const first = r.windows[0];
      const last = r.windows[r.windows.length - 1];
      const mb = (w?: { tableBytes: number; indexBytes: number }) =>
        w ? ((w.tableBytes + w.indexBytes) / 1024 / 1024).toFixed(1) : "–";
      const name =
        p.key === "before" ? "pg-outbox-worker before" : (all.find((s) => s.key === p.key)?.label ?? p.key);
      const row = `| ${name}${producers === 4 ? "" : ` (${producers} producer connections)`} | ${av ? "on" : "off"} | ${mb(first)} | ${mb(last)} | ${fmt(last?.deadTuples ?? Number.NaN)} | ${first?.p50.toFixed(1)} / ${first?.p99.toFixed(1)} | ${last?.p50.toFixed(1)} / ${last?.p99.toFixed(1)} | ${fmt(r.cost.walBytes / r.messages)} | ${r.cpuRest.toFixed(1)} | ${r.autovacuumRuns} |`;
      out.push(row);
      // As it lands: a later failure or a cut session keeps what ran.
      process.stderr.write(`${row}\n`);
    }
  }
}
if (pickupRuns > 0 && before) await pickupAndProducers();

/** Pickup latency (LISTEN, poll-only) and producer rates, this checkout beside `--before`, interleaved. */
async function pickupAndProducers(): Promise<void> {
  const checkouts = [
    { name: "before", cwd: before },
    { name: "after", cwd: undefined },
  ];
  const latency = new Map<string, LatencyResult[]>();
  const producers = new Map<string, ProducerResult[]>();
  const modes = ["plainUnnamed", "default", "keyed"] as const;
  const add = <T>(m: Map<string, T[]>, k: string, v: T) => m.set(k, [...(m.get(k) ?? []), v]);
  for (let r = 0; r < pickupRuns; r++) {
    for (const c of checkouts) {
      for (const listen of [true, false])
        add(
          latency,
          `${c.name}:${listen}`,
          await job<LatencyResult>(
            { kind: "latency", peer: "outbox", listen, rate: 200, seconds: 10 },
            c.cwd,
          ),
        );
      for (const mode of modes)
        add(
          producers,
          `${c.name}:${mode}`,
          await job<ProducerResult>(
            { kind: "producer", peer: "outbox", mode, clients: 8, seconds: 10 },
            c.cwd,
          ),
        );
    }
  }
  const ms = (xs: number[]) => `${median(xs).toFixed(1)} (${range(xs, 1)})`;
  out.push(
    "",
    `Pickup latency, 200 msg/s for 10 s from a pool of 4, one worker at defaults (concurrency 10), commit returned → handler start, ms; ${pickupRuns} runs each, median (range):`,
    "",
    "| checkout | LISTEN p50 | LISTEN p99 | poll-only p50 | poll-only p99 |",
    "| --- | ---: | ---: | ---: | ---: |",
  );
  for (const c of checkouts) {
    const on = latency.get(`${c.name}:true`) ?? [];
    const off = latency.get(`${c.name}:false`) ?? [];
    out.push(
      `| ${c.name} | ${ms(on.map((x) => x.p50))} | ${ms(on.map((x) => x.p99))} | ${ms(off.map((x) => x.p50))} | ${ms(off.map((x) => x.p99))} |`,
    );
  }
  out.push(
    "",
    "Producers, 8 clients for 10 s, transactions a second (`BEGIN; INSERT/publish; COMMIT`), median (range); `publish` ÷ the unnamed INSERT of the same checkout:",
    "",
    "| checkout | plain INSERT (unnamed) | `publish` | `publish` with a key | `publish` ÷ INSERT |",
    "| --- | ---: | ---: | ---: | ---: |",
  );
  for (const c of checkouts) {
    const tx = (mode: string) => (producers.get(`${c.name}:${mode}`) ?? []).map((x) => x.txPerSec);
    out.push(
      `| ${c.name} | ${mr(tx("plainUnnamed"))} | ${mr(tx("default"))} | ${mr(tx("keyed"))} | ${(median(tx("default")) / median(tx("plainUnnamed"))).toFixed(2)}× |`,
    );
  }
}
console.log(out.join("\n"));
