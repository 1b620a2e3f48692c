/**
 * What follow-up messages cost the drain. N parent rows (about 100-byte payloads) inserted up front, one
 * worker; time until every parent is acknowledged. Modes, interleaved run by run so drift of a shared
 * machine hits them alike, each as a ratio of medians against `none` of the same parents:
 *
 * - `none`: the handler returns nothing (the plain ack statement: the baseline).
 * - `one`: the handler returns one follow-up, to a queue this worker does not serve (so the figure is the
 *   parents' drain alone: each ack deletes its parent and inserts its follow-up in one statement).
 * - `served`: the same, and the worker also serves the follow-ups' queue: time until parents and follow-ups
 *   are all acknowledged, reported as parents/s (each parent is then two messages of work).
 * - `keyed-none` / `keyed-one`: parents with a key each (the keyed ack: `ack_key_heads` and, with follow-ups, the
 *   follow-up insert in the same statement); `keyed-one` is compared with `keyed-none`.
 *
 *   node --import tsx bench/follow-ups.ts --rows 50000 --runs 3 --concurrency 10 --modes none,one,served
 *   (--json prints the results as one JSON line instead of the table: bench/run.ts reads that.)
 */
import pg from "pg";
import { followUp } from "../src/contract/follow-up.js";
import { migrate } from "../src/migrate/migrator.js";
import { outboxNames } from "../src/sql/names.js";
import { createWorker } from "../src/worker/worker.js";
import { arg, DATABASE_URL, machine, median, range } from "./lib.js";

export const FOLLOW_UP_MODES = ["none", "one", "served", "keyed-none", "keyed-one"] as const;
export type FollowUpMode = (typeof FOLLOW_UP_MODES)[number];

/** One mode's runs: parents acknowledged per second, and the worker's CPU per parent. */
export interface FollowUpResult {
  mode: FollowUpMode;
  rates: number[];
  cpuUs: number[];
}

const rows = Number(arg("rows", "50000"));
const runs = Number(arg("runs", "3"));
const concurrency = Number(arg("concurrency", "10"));
const batchSize = Number(arg("batch", "500"));
const modes = arg("modes", "none,one,served,keyed-none,keyed-one").split(",") as FollowUpMode[];
const json = process.argv.includes("--json");
for (const mode of modes) {
  if (!FOLLOW_UP_MODES.includes(mode))
    throw new Error(`--modes: one of ${FOLLOW_UP_MODES.join(", ")}, got ${mode}`);
}
const schema = "bench_follow_ups";
const names = outboxNames(schema);
const log = (line: string) => {
  if (!json) console.log(line);
};

const pool = new pg.Pool({ connectionString: DATABASE_URL, max: 4 });
await pool.query(`DROP SCHEMA IF EXISTS ${names.quotedSchema} CASCADE`);
await migrate({ connection: DATABASE_URL, schema });

const FILL_CHUNK = 2000;

async function fill(keyed: boolean): Promise<void> {
  await pool.query(`TRUNCATE ${names.messages}`);
  // In chunks: the key-head trigger takes each new key's advisory lock until commit, and one statement of
  // 50,000 keys would run out of the lock table (max_locks_per_transaction).
  for (let from = 1; from <= rows; from += FILL_CHUNK) {
    await pool.query(
      `INSERT INTO ${names.messages} (queue, payload, key)
       SELECT 'parent', jsonb_build_object('orderId', g, 'customer', 'customer-' || (g % 97), 'note', repeat('x', 48)),
              CASE WHEN $3 THEN 'k-' || g END
       FROM generate_series($1::int, $2::int) AS g`,
      [from, Math.min(rows, from + FILL_CHUNK - 1), keyed],
    );
  }
  await pool.query(`VACUUM ANALYZE ${names.messages}`);
}

async function drainOnce(mode: FollowUpMode): Promise<{ rate: number; cpuUs: number }> {
  await fill(mode.startsWith("keyed"));
  const publishes = mode === "one" || mode === "served" || mode === "keyed-one";
  const expected = mode === "served" ? 2 * rows : rows;
  let acked = 0;
  let finish!: () => void;
  const done = new Promise<void>((resolve) => {
    finish = resolve;
  });
  const worker = createWorker({
    connection: DATABASE_URL,
    schema,
    concurrency,
    batchSize,
    logger: false,
    queues: {
      parent: publishes
        ? (payload: unknown) => followUp("child", { parent: (payload as { orderId: number }).orderId })
        : () => {},
      ...(mode === "served" ? { child: () => {} } : {}),
    },
  });
  worker.on("acked", () => {
    if (++acked === expected) finish();
  });
  const started = performance.now();
  const cpu = process.cpuUsage();
  await worker.start();
  await done;
  const seconds = (performance.now() - started) / 1000;
  const used = process.cpuUsage(cpu);
  await worker.stop();
  const { rows: left } = await pool.query(
    `SELECT count(*) FILTER (WHERE queue = 'parent')::int AS parents, count(*) FILTER (WHERE queue = 'child')::int AS children
     FROM ${names.messages}`,
  );
  const wantChildren = mode === "one" || mode === "keyed-one" ? rows : 0;
  if (left[0].parents !== 0 || left[0].children !== wantChildren)
    throw new Error(
      `${mode}: ${JSON.stringify(left[0])} left, expected 0 parents and ${wantChildren} follow-ups`,
    );
  return { rate: rows / seconds, cpuUs: (used.user + used.system) / rows };
}

log(
  `# follow-ups: ${rows} parents, concurrency ${concurrency}, batch ${batchSize}, ${runs} runs; ${await machine(pool)}\n`,
);
const results = new Map(modes.map((m) => [m, { mode: m, rates: [], cpuUs: [] } as FollowUpResult]));
for (let r = 0; r < runs; r++) {
  for (const m of modes) {
    const x = await drainOnce(m);
    results.get(m)?.rates.push(x.rate);
    results.get(m)?.cpuUs.push(x.cpuUs);
  }
}
if (json) {
  console.log(JSON.stringify([...results.values()]));
} else {
  log("| mode | parents/s (median) | range | vs baseline | worker CPU µs/parent (median) |");
  log("|---|---:|---:|---:|---:|");
  for (const x of results.values()) {
    const base = results.get(x.mode.startsWith("keyed") ? "keyed-none" : "none");
    const ratio = base && base !== x ? (median(x.rates) / median(base.rates)).toFixed(2) : "1.00";
    log(
      `| ${x.mode} | ${median(x.rates).toFixed(0)} | ${range(x.rates)} | ${ratio} | ${median(x.cpuUs).toFixed(1)} |`,
    );
  }
}
await pool.query(`DROP SCHEMA ${names.quotedSchema} CASCADE`);
await pool.end();
