/**
 * Topics (issue 27): what publishing one event to a topic costs a producer, and how fast one worker drains
 * the copies, side by side with publishing to one queue and with pg-boss's own pub/sub. Rows, interleaved
 * run by run (each a fresh process and a fresh schema):
 *
 * - producer: CLIENTS connections, each committing transactions of one publish for `seconds`, a worker-like
 *   LISTEN connection attached; `createPublisher({ schema })` (default options): `publish` to one queue,
 *   `publishToTopic` with 1, 3 and 10 subscribed queues; pg-boss `send` to one queue and `publish(event)`
 *   with 3 `subscribe`d queues (default options; each `publish` is one SELECT and one autocommit `send` per
 *   queue). Then WAL bytes per event: one connection publishing WAL_EVENTS events one after the other,
 *   `pg_current_wal_insert_lsn()` before and after, the smallest of WAL_BATCHES batches (the server is shared:
 *   another session's writes can only add; small batches, so one of them likely runs alone).
 * - drain: EVENTS events × 3 rows, one worker with default options (`createWorker` with only its queues):
 *   published to one queue (the keyless drain), to 3 queues by plain INSERT (no topic: what serving three
 *   queues costs by itself), and fanned out by `fan_out` to 3 subscribed queues (the topic rows, with their
 *   `outbox-topic` header), served by one worker. Messages/s from the first handler start until no row is left.
 *
 *   npm run bench:topics -- [--runs 3] [--seconds 5] [--events 10000] [--idle-wait 60] [--only producer,drain]
 *   npm run bench:topics -- --quick          # 1 run, 2 s per producer row, 3,000 events: about a minute
 *   npm run bench:topics -- --prototype <name>   # adds the topic rows with bench/prototypes/<name>.sql applied
 *
 * Each job first waits up to --idle-wait seconds for an idle machine, and runs again (at most twice) when the
 * machine is busy right after it; the busy figure is printed per job.
 * Peers come from bench/package.json (`npm ci --prefix bench`).
 */
import { readFileSync } from "node:fs";
import os from "node:os";
import pg from "pg";
import { migrate } from "../src/migrate/migrator.js";
import { createPublisher } from "../src/produce/publisher.js";
import { outboxNames } from "../src/sql/names.js";
import { subscribe } from "../src/subscribe/subscriptions.js";
import { createWorker } from "../src/worker/worker.js";
import {
  arg,
  cpuMeter,
  DATABASE_URL,
  fmt,
  machine,
  machineCpuSeconds,
  median,
  PAYLOAD_SQL,
  payload,
  RESULT_MARK,
  range,
  runJob,
  sleep,
  until,
} from "./lib.js";
import { adminPool, dropSchema, vacuumSchema } from "./peers/peer.js";
import { pgbossPubSub } from "./peers/pgboss-pubsub.js";

const TOPIC = "bench.placed";
const CLIENTS = 8;
const WAL_EVENTS = 100;
const WAL_BATCHES = 8;
const FILL_CHUNK = 5000;
/** The subscribed queues of a topic with n subscribers: bench.sub0 … bench.sub<n-1>. */
const subscriberQueues = (n: number) => Array.from({ length: n }, (_, i) => `bench.sub${i}`);

type ProducerMode = "queue" | "topic" | "bossSend" | "bossPublish";
type DrainMode = "queue" | "queues" | "topic";
type Spec =
  | {
      kind: "producer";
      mode: ProducerMode;
      subscribers: number;
      clients: number;
      seconds: number;
      /** bench/prototypes/<name>.sql applied to the schema after migrate (a proposed change, not the product). */
      prototype?: string;
    }
  | { kind: "drain"; mode: DrainMode; events: number; subscribers: number };

interface ProducerResult {
  txPerSec: number;
  rowsPerSec: number;
  notificationsPerSec: number;
  /** WAL bytes per event, the smallest batch, and every batch. */
  walPerEvent: number;
  walBatches: number[];
}
interface DrainResult {
  rate: number;
  rows: number;
  cpuNode: number;
  cpuRest: number;
}

// ------------------------------------------------------------------------------------------------ jobs

/** A prototype's SQL (bench/prototypes/<name>.sql) for one schema. */
function prototypeSql(name: string, quotedSchema: string): string {
  if (!/^[a-z0-9-]+$/.test(name))
    throw new Error(`--prototype: a file name under bench/prototypes, got ${name}`);
  const file = new URL(`./prototypes/${name}.sql`, import.meta.url);
  return readFileSync(file, "utf8").replaceAll("{{schema}}", quotedSchema);
}

/** WAL bytes between two calls of the returned function, as Postgres counts them (the whole cluster). */
async function walMeter(pool: pg.Pool): Promise<() => Promise<number>> {
  const lsn = async () =>
    (await pool.query<{ l: string }>("SELECT pg_current_wal_insert_lsn()::text AS l")).rows[0]?.l ?? "0/0";
  const from = await lsn();
  return async () => {
    const to = await lsn();
    return Number((await pool.query("SELECT pg_wal_lsn_diff($1, $2) AS d", [to, from])).rows[0].d);
  };
}

/** Runs `one(n)` on `clients` loops for `seconds`; returns how many completed. */
async function timed(clients: number, seconds: number, one: (n: number) => Promise<void>): Promise<number> {
  let next = 0;
  let done = 0;
  const deadline = performance.now() + seconds * 1000;
  await Promise.all(
    Array.from({ length: clients }, async () => {
      while (performance.now() < deadline) {
        await one(next++);
        done++;
      }
    }),
  );
  return done;
}

/** WAL bytes per event of `one` run WAL_EVENTS times in a row, WAL_BATCHES batches. */
async function walPerEvent(pool: pg.Pool, one: (n: number) => Promise<void>, from: number) {
  const batches: number[] = [];
  for (let b = 0; b < WAL_BATCHES; b++) {
    const stop = await walMeter(pool);
    for (let i = 0; i < WAL_EVENTS; i++) await one(from + b * WAL_EVENTS + i);
    batches.push((await stop()) / WAL_EVENTS);
  }
  return { walPerEvent: Math.min(...batches), walBatches: batches };
}

async function producerJob(spec: Extract<Spec, { kind: "producer" }>): Promise<ProducerResult> {
  const boss = spec.mode === "bossSend" || spec.mode === "bossPublish";
  return boss ? pgbossProducer(spec) : outboxProducer(spec);
}

async function outboxProducer(spec: Extract<Spec, { kind: "producer" }>): Promise<ProducerResult> {
  const schema = "bench_topics_producer";
  const names = outboxNames(schema);
  const admin = adminPool();
  await dropSchema(admin, schema);
  await migrate({ connection: DATABASE_URL, schema });
  if (spec.prototype) await admin.query(prototypeSql(spec.prototype, names.quotedSchema));
  const queues = subscriberQueues(spec.subscribers);
  for (const queue of queues) await subscribe(admin, { topic: TOPIC, queue, schema });
  await admin.query("CHECKPOINT");
  // A worker-like LISTEN connection, so notifications are delivered as they would be in production.
  const listener = new pg.Client({ connectionString: DATABASE_URL });
  await listener.connect();
  let notifications = 0;
  listener.on("notification", () => notifications++);
  await listener.query(`LISTEN "${names.channel}"`);

  const pool = new pg.Pool({ connectionString: DATABASE_URL, max: spec.clients + 1 });
  const publisher = createPublisher({ schema });
  const queue = queues[0] ?? "bench.sub0";
  const one = async (n: number) => {
    const client = await pool.connect();
    try {
      await client.query("BEGIN");
      if (spec.mode === "queue") await publisher.publish(client, queue, payload(n));
      else await publisher.publishToTopic(client, TOPIC, payload(n));
      await client.query("COMMIT");
    } catch (error) {
      await client.query("ROLLBACK").catch(() => {});
      throw error;
    } finally {
      client.release();
    }
  };
  const events = await timed(spec.clients, spec.seconds, one);
  const notificationsPerSec = notifications / spec.seconds;
  const wal = await walPerEvent(admin, one, events + 1);
  const copies = spec.mode === "queue" ? 1 : spec.subscribers;
  const stored = (await admin.query(`SELECT count(*)::int AS n FROM ${names.messages}`)).rows[0].n;
  const dead = (await admin.query(`SELECT count(*)::int AS n FROM ${names.deadLetters}`)).rows[0].n;
  const expected = (events + WAL_BATCHES * WAL_EVENTS) * copies;
  await pool.end();
  await listener.end();
  await dropSchema(admin, schema);
  await admin.end();
  if (stored !== expected || dead !== 0) {
    throw new Error(`${stored} rows and ${dead} dead letters stored, expected ${expected} rows`);
  }
  return {
    txPerSec: events / spec.seconds,
    rowsPerSec: (events * copies) / spec.seconds,
    notificationsPerSec,
    ...wal,
  };
}

async function pgbossProducer(spec: Extract<Spec, { kind: "producer" }>): Promise<ProducerResult> {
  const schema = "bench_topics_pgboss";
  const admin = adminPool();
  const boss = await pgbossPubSub(schema, TOPIC, spec.subscribers, spec.clients);
  await admin.query("CHECKPOINT");
  const one = spec.mode === "bossSend" ? boss.send : boss.publish;
  const events = await timed(spec.clients, spec.seconds, one);
  const wal = await walPerEvent(admin, one, events + 1);
  const copies = spec.mode === "bossSend" ? 1 : spec.subscribers;
  const stored = await boss.jobs();
  await boss.teardown();
  await admin.end();
  const expected = (events + WAL_BATCHES * WAL_EVENTS) * copies;
  if (stored !== expected) throw new Error(`${stored} jobs stored, expected ${expected}`);
  return {
    txPerSec: events / spec.seconds,
    rowsPerSec: (events * copies) / spec.seconds,
    notificationsPerSec: 0,
    ...wal,
  };
}

async function drainJob(spec: Extract<Spec, { kind: "drain" }>): Promise<DrainResult> {
  const schema = "bench_topics_drain";
  const names = outboxNames(schema);
  const admin = adminPool();
  await dropSchema(admin, schema);
  await migrate({ connection: DATABASE_URL, schema });
  const rows = spec.events * spec.subscribers;
  const all = subscriberQueues(spec.subscribers);
  const queues = spec.mode === "queue" ? all.slice(0, 1) : all;
  if (spec.mode === "topic") {
    for (const queue of queues) await subscribe(admin, { topic: TOPIC, queue, schema });
    // Through fan_out itself, as publishManyToTopic and a plain-SQL producer write them: each event's
    // copies side by side in id order, each with its outbox-topic header.
    for (let a = 1; a <= spec.events; a += FILL_CHUNK) {
      const b = Math.min(spec.events, a + FILL_CHUNK - 1);
      await admin.query(
        `SELECT count(*) FROM ${names.quotedSchema}.fan_out($1, (
           SELECT jsonb_agg(jsonb_build_object('payload', ${PAYLOAD_SQL}) ORDER BY g)
           FROM generate_series($2::int, $3::int) AS g))`,
        [TOPIC, a, b],
      );
    }
  } else {
    // Row g goes to queue g % queues: the queues interleaved in id order, as the fan-out's copies are.
    await admin.query(
      `INSERT INTO ${names.messages} (queue, payload)
       SELECT ($1::text[])[1 + g % cardinality($1::text[])], ${PAYLOAD_SQL}
       FROM generate_series(1, $2::int) AS g`,
      [queues, rows],
    );
  }
  const filled = (await admin.query(`SELECT count(*)::int AS n FROM ${names.messages}`)).rows[0].n;
  if (filled !== rows) throw new Error(`fill: ${filled} rows, expected ${rows}`);
  await vacuumSchema(admin, schema);

  let handled = 0;
  let first = 0;
  const handler = () => {
    if (handled === 0) first = performance.now();
    handled++;
  };
  const cpu = cpuMeter();
  const worker = createWorker({
    connection: DATABASE_URL,
    schema,
    logger: false,
    queues: Object.fromEntries(queues.map((q) => [q, handler])),
  });
  await worker.start();
  await until(() => handled >= rows, 600_000, 1);
  const remaining = async () =>
    (await admin.query(`SELECT count(*)::int AS n FROM ${names.messages}`)).rows[0].n as number;
  await until(async () => (await remaining()) === 0, 60_000, 2);
  const seconds = (performance.now() - first) / 1000;
  const used = cpu.stop();
  await worker.stop({ timeoutMs: 10_000 });
  await dropSchema(admin, schema);
  await admin.end();
  if (handled !== rows) throw new Error(`${handled} handler calls for ${rows} rows`);
  return {
    rate: rows / seconds,
    rows,
    cpuNode: (used.node * 1e6) / rows,
    cpuRest: (used.rest * 1e6) / rows,
  };
}

// -------------------------------------------------------------------------------------------- the runs

/** CPU-seconds per second the whole machine spends over the next second (all cores together). */
async function busy(): Promise<number> {
  const before = machineCpuSeconds();
  await sleep(1000);
  return machineCpuSeconds() - before;
}

/** Busy below this many CPU-seconds a second (over 1 s): the machine is idle. */
const QUIET = 0.25;

/** Waits up to `seconds` for an idle machine; returns the last busy figure. */
async function idle(seconds: number): Promise<number> {
  const deadline = Date.now() + seconds * 1000;
  for (;;) {
    const b = await busy();
    if (b < QUIET || Date.now() >= deadline) return b;
  }
}

/** `xs` starting at its element `by` (mod length), wrapping around. */
const rotate = <T>(xs: readonly T[], by: number): T[] => xs.map((_, i) => xs[(i + by) % xs.length] as T);

/** Median and range, e.g. "45,123 (43,000–47,002)". */
const mr = (xs: number[], digits = 0) => `${fmt(median(xs), digits)} (${range(xs, digits)})`;
/** Ratio of medians, and the range of the run-by-run ratios. */
function ratio(ours: number[], theirs: number[]): { value: number; text: string } {
  const value = median(ours) / median(theirs);
  const per = ours.map((x, i) => x / (theirs[i] ?? Number.NaN)).filter(Number.isFinite);
  return { value, text: `${value.toFixed(2)}× (${range(per, 2)})` };
}

async function main(): Promise<void> {
  const quick = process.argv.includes("--quick");
  const runs = Number(arg("runs", quick ? "1" : "3"));
  const seconds = Number(arg("seconds", quick ? "2" : "5"));
  const events = Number(arg("events", quick ? "3000" : "10000"));
  const idleWait = Number(arg("idle-wait", quick ? "0" : "60"));
  const only = arg("only", "producer,drain").split(",");
  const prototype = arg("prototype", "");

  const producerRows: { key: string; label: string; spec: Extract<Spec, { kind: "producer" }> }[] = [
    ["queue", "this project: `publish` to one queue", "queue", 1],
    ["topic1", "this project: `publishToTopic`, 1 subscribed queue", "topic", 1],
    ["topic3", "this project: `publishToTopic`, 3 subscribed queues", "topic", 3],
    ["topic10", "this project: `publishToTopic`, 10 subscribed queues", "topic", 10],
    ["bossSend", "pg-boss `send` to one queue", "bossSend", 1],
    ["bossPublish", "pg-boss `publish(event)`, 3 `subscribe`d queues", "bossPublish", 3],
    // The same topic rows with a proposed change to fan_out applied, side by side.
    ...(prototype
      ? [1, 3, 10].map((n) => [
          `topic${n}:${prototype}`,
          `\`publishToTopic\`, ${n} subscribed queue${n > 1 ? "s" : ""}, prototype \`${prototype}\``,
          "topic",
          n,
        ])
      : []),
  ].map(([key, label, mode, subscribers]) => ({
    key: key as string,
    label: label as string,
    spec: {
      kind: "producer",
      mode: mode as ProducerMode,
      subscribers: subscribers as number,
      clients: CLIENTS,
      seconds,
      ...(String(key).includes(":") ? { prototype } : {}),
    },
  }));
  const drainRows: { key: string; label: string; spec: Extract<Spec, { kind: "drain" }> }[] = [
    ["queue", `${fmt(events * 3)} rows in one queue (the keyless drain)`, "queue"],
    ["queues", `${fmt(events * 3)} rows in 3 queues by plain INSERT (no topic)`, "queues"],
    ["topic", `${fmt(events)} events × 3 subscribed queues (fan_out's rows)`, "topic"],
  ].map(([key, label, mode]) => ({
    key: key as string,
    label: label as string,
    spec: { kind: "drain", mode: mode as DrainMode, events, subscribers: 3 },
  }));

  const pool = new pg.Pool({ connectionString: DATABASE_URL, max: 1 });
  const host = await machine(pool);
  await pool.end();
  const load0 = os.loadavg();
  const producers = new Map<string, ProducerResult[]>();
  const drains = new Map<string, DrainResult[]>();
  const busyBefore: number[] = [];
  let repeated = 0;
  const log = (line: string) => process.stderr.write(`${line}\n`);
  for (let r = 0; r < runs; r++) {
    // Each run starts one row further down its section: no row always follows the same one (a drain
    // right after a producer's writes, say).
    const jobs = [
      ...rotate(only.includes("producer") ? producerRows : [], r).map((p) => ({
        ...p,
        into: "producer" as const,
      })),
      ...rotate(only.includes("drain") ? drainRows : [], r).map((d) => ({ ...d, into: "drain" as const })),
    ];
    for (const j of jobs) {
      // As bench/run.ts: a job starts on an idle machine (waiting up to --idle-wait s) and is run again, at
      // most twice, when the machine is busy right after it (when nothing of the bench runs any more).
      let b = 0;
      let result: ProducerResult | DrainResult;
      for (let attempt = 0; ; attempt++) {
        b = await idle(idleWait);
        result = await runJob<ProducerResult | DrainResult>(j.spec, { script: "bench/topics.ts" });
        await sleep(300);
        const after = await busy();
        if (after < QUIET || attempt >= 2) break;
        repeated++;
        log(`${j.key}: machine busy (${after.toFixed(2)} CPU-s/s) after the job: running it again`);
      }
      busyBefore.push(b);
      if (j.into === "producer") {
        const x = result as ProducerResult;
        producers.set(j.key, [...(producers.get(j.key) ?? []), x]);
        log(
          `run ${r + 1} ${j.key}: ${fmt(x.txPerSec)} tx/s, ${fmt(x.walPerEvent)} WAL bytes/event (busy ${b.toFixed(2)} CPU-s/s before)`,
        );
      } else {
        const x = result as DrainResult;
        drains.set(j.key, [...(drains.get(j.key) ?? []), x]);
        log(`run ${r + 1} drain ${j.key}: ${fmt(x.rate)} messages/s (busy ${b.toFixed(2)} CPU-s/s before)`);
      }
    }
  }
  const load1 = os.loadavg();

  const out: string[] = [];
  const say = (line = "") => out.push(line);
  say(
    `Command: \`npm run bench:topics --${quick ? " --quick" : ""} --runs ${runs} --seconds ${seconds} --events ${events}${prototype ? ` --prototype ${prototype}` : ""}\`, ` +
      `${new Date().toISOString().slice(0, 10)}. ${host}. Load average ${load0.map((x) => x.toFixed(1)).join(" ")} ` +
      `before, ${load1.map((x) => x.toFixed(1)).join(" ")} after; machine busy before each job ` +
      `${range(busyBefore, 2)} CPU-s/s (median ${median(busyBefore).toFixed(2)}); ${repeated} job${repeated === 1 ? "" : "s"} run again ` +
      `(machine busy right after). Median (range) of ${runs} runs, interleaved (each run starts one row further down).`,
  );
  say();
  const targets: string[] = [];
  if (producers.size) {
    const tx = (k: string) => (producers.get(k) ?? []).map((x) => x.txPerSec);
    say(
      `| producer (${CLIENTS} clients, one event per transaction, ${seconds} s) | events/s | rows/s | ÷ \`publish\` to one queue | WAL bytes/event | notifications/s |`,
    );
    say("|---|---:|---:|---:|---:|---:|");
    for (const p of producerRows) {
      const xs = producers.get(p.key) ?? [];
      const vs = p.key.startsWith("boss") ? "–" : ratio(tx(p.key), tx("queue")).text;
      say(
        `| ${p.label} | ${mr(tx(p.key))} | ${fmt(median(xs.map((x) => x.rowsPerSec)))} | ${vs} | ` +
          `${fmt(median(xs.map((x) => x.walPerEvent)))} | ${fmt(median(xs.map((x) => x.notificationsPerSec)))} |`,
      );
    }
    say();
    const t3 = ratio(tx("topic3"), tx("queue"));
    targets.push(
      `- publish to a topic with 3 subscribers ≥ 0.6× publish to one queue: ${t3.text}, ${t3.value >= 0.6 ? "holds" : "**missed**"}`,
      ...(prototype
        ? [
            `- the same with prototype \`${prototype}\`: ${ratio(tx(`topic3:${prototype}`), tx("queue")).text}`,
          ]
        : []),
      `- this project's \`publishToTopic\` (3 subscribers) ÷ pg-boss \`publish\` (3 subscribers): ${ratio(tx("topic3"), tx("bossPublish")).text}`,
      `- pg-boss \`publish\` (3 subscribers) ÷ its own \`send\` to one queue: ${ratio(tx("bossPublish"), tx("bossSend")).text}`,
    );
  }
  if (drains.size) {
    const rate = (k: string) => (drains.get(k) ?? []).map((x) => x.rate);
    say(
      "| drain (one worker, default options: concurrency 10, batchSize 500) | messages/s | ÷ keyless drain | CPU µs/msg, worker | CPU µs/msg, rest (Postgres) |",
    );
    say("|---|---:|---:|---:|---:|");
    for (const d of drainRows) {
      const xs = drains.get(d.key) ?? [];
      say(
        `| ${d.label} | ${mr(rate(d.key))} | ${d.key === "queue" ? "–" : ratio(rate(d.key), rate("queue")).text} | ` +
          `${fmt(median(xs.map((x) => x.cpuNode)), 1)} | ${fmt(median(xs.map((x) => x.cpuRest)), 1)} |`,
      );
    }
    say();
    const d3 = ratio(rate("topic"), rate("queue"));
    targets.push(
      `- draining the fan-out rows ≥ 0.9× the keyless drain: ${d3.text}, ${d3.value >= 0.9 ? "holds" : "**missed**"}`,
    );
  }
  say("Targets:");
  say();
  for (const t of targets) say(t);
  console.log(out.join("\n"));
}

// A job (spawned by main through runJob) gets its spec as JSON; the runner gets flags.
const first = process.argv[2];
if (first?.startsWith("{")) {
  const spec = JSON.parse(first) as Spec;
  const result = spec.kind === "producer" ? await producerJob(spec) : await drainJob(spec);
  process.stdout.write(`${RESULT_MARK}${JSON.stringify(result)}\n`);
  // pg-boss may leave timers behind: the result is out, so leave now.
  process.exit(0);
} else {
  await main();
}
