/**
 * Dedupe keys (issue 29): what a `dedupeKey` costs a producer, and that publishes without one pay nothing
 * for the feature. CLIENTS connections each commit single-publish transactions for `seconds`, in each mode,
 * the modes interleaved run by run; median (and range) of the runs, plus WAL bytes per publish.
 *
 * - keyless, before: `publish` without a dedupe key on a schema migrated up to 0015 (no dedupe_key column,
 *   no partial unique index): the baseline.
 * - keyless: the same on the latest schema (the partial index has no entry for such a row).
 * - unique dedupeKey: every publish with its own key (an insert, plus an entry in the partial index).
 * - duplicate dedupeKey: every publish repeats a key whose message is pending (the no-op: the arbiter's
 *   look-up and the pending id read back, nothing written).
 *
 *   npm run bench:dedupe -- [--runs 5] [--seconds 5]
 *   npm run bench:dedupe -- --quick     # 1 run, 1 s per mode: proves it runs, not a figure
 */
import { copyFile, mkdtemp, readdir, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import pg from "pg";
import { MIGRATIONS_DIR } from "../src/migrate/migration-files.js";
import { migrate } from "../src/migrate/migrator.js";
import { createPublisher, type Publisher } from "../src/produce/publisher.js";
import { outboxNames } from "../src/sql/names.js";
import { arg, DATABASE_URL, fmt, machine, median, payload, range } from "./lib.js";

const quick = process.argv.includes("--quick");
const runs = Number(arg("runs", quick ? "1" : "5"));
const seconds = Number(arg("seconds", quick ? "1" : "5"));
const CLIENTS = 8;
const WAL_PUBLISHES = 200;
const QUEUE = "bench.dedupe";
/** The last migration before dedupe keys. */
const BEFORE = 15;

interface Mode {
  name: string;
  schema: string;
  /** The publish one transaction runs; `n` is unique per process. */
  publish: (publisher: Publisher, client: pg.PoolClient, n: number) => Promise<unknown>;
}

const before = outboxNames("bench_dedupe_before");
const after = outboxNames("bench_dedupe");
const modes: Mode[] = [
  {
    name: `keyless, schema before dedupe keys (≤ ${String(BEFORE).padStart(4, "0")})`,
    schema: before.schema,
    publish: (p, c, n) => p.publish(c, QUEUE, payload(n)),
  },
  { name: "keyless", schema: after.schema, publish: (p, c, n) => p.publish(c, QUEUE, payload(n)) },
  {
    name: "unique dedupeKey",
    schema: after.schema,
    publish: (p, c, n) => p.publish(c, QUEUE, payload(n), { dedupeKey: `order-${n}` }),
  },
  {
    name: "duplicate dedupeKey (no-op)",
    schema: after.schema,
    publish: (p, c, n) => p.publish(c, QUEUE, payload(n), { dedupeKey: "pending" }),
  },
];

let counter = 0;

async function runMode(pool: pg.Pool, mode: Mode): Promise<number> {
  const publisher = createPublisher({ schema: mode.schema, notify: { connection: pool } });
  const deadline = performance.now() + seconds * 1000;
  let count = 0;
  await Promise.all(
    Array.from({ length: CLIENTS }, async () => {
      const client = await pool.connect();
      try {
        while (performance.now() < deadline) {
          await client.query("BEGIN");
          await mode.publish(publisher, client, counter++);
          await client.query("COMMIT");
          count++;
        }
      } finally {
        client.release();
      }
    }),
  );
  return count / seconds;
}

/** WAL bytes per publish: one connection, one publish per transaction, one after the other. */
async function walPerPublish(pool: pg.Pool, mode: Mode): Promise<number> {
  const publisher = createPublisher({ schema: mode.schema, notify: false });
  const client = await pool.connect();
  try {
    const lsn = async () =>
      (await client.query<{ lsn: string }>("SELECT pg_current_wal_insert_lsn()::text AS lsn")).rows[0]?.lsn;
    const start = await lsn();
    for (let i = 0; i < WAL_PUBLISHES; i++) {
      await client.query("BEGIN");
      await mode.publish(publisher, client, counter++);
      await client.query("COMMIT");
    }
    const end = await lsn();
    const { rows } = await client.query<{ bytes: string }>("SELECT pg_wal_lsn_diff($2, $1)::text AS bytes", [
      start,
      end,
    ]);
    return Number(rows[0]?.bytes) / WAL_PUBLISHES;
  } finally {
    client.release();
  }
}

/** A migrations folder with the shipped files up to `version`: a schema as an older release left it. */
async function migrationsUpTo(version: number): Promise<string> {
  const dir = await mkdtemp(path.join(os.tmpdir(), "bench-dedupe-"));
  for (const file of await readdir(MIGRATIONS_DIR))
    if (/^\d{4}_\w+\.sql$/.test(file) && Number(file.slice(0, 4)) <= version)
      await copyFile(path.join(MIGRATIONS_DIR, file), path.join(dir, file));
  return dir;
}

const pool = new pg.Pool({ connectionString: DATABASE_URL, max: CLIENTS + 2 });
for (const names of [before, after]) await pool.query(`DROP SCHEMA IF EXISTS ${names.quotedSchema} CASCADE`);
const oldDir = await migrationsUpTo(BEFORE);
try {
  await migrate({ connection: pool, schema: before.schema, migrationsDir: oldDir });
} finally {
  await rm(oldDir, { recursive: true, force: true });
}
await migrate({ connection: pool, schema: after.schema });

const rates: Record<string, number[]> = {};
const wal: Record<string, number[]> = {};
for (let r = 0; r < runs; r++) {
  for (const mode of modes) {
    const names = mode.schema === before.schema ? before : after;
    await pool.query(`TRUNCATE ${names.messages}`);
    // The duplicate mode's pending message, published once and never delivered.
    await createPublisher({ schema: after.schema, notify: false }).publish(pool, QUEUE, payload(0), {
      dedupeKey: "pending",
    });
    await pool.query("CHECKPOINT");
    rates[mode.name] = [...(rates[mode.name] ?? []), await runMode(pool, mode)];
    wal[mode.name] = [...(wal[mode.name] ?? []), await walPerPublish(pool, mode)];
  }
}

const base = median(rates[modes[0]?.name ?? ""] ?? []);
console.log(`\n${await machine(pool)}`);
console.log(
  `${CLIENTS} clients, one publish per transaction, ${seconds} s per mode, median of ${runs} run(s)${quick ? " (--quick: not a figure)" : ""}\n`,
);
console.log("| mode | tx/s (median) | range | vs keyless before | WAL bytes/publish (median) |");
console.log("|---|---:|---:|---:|---:|");
for (const mode of modes) {
  const xs = rates[mode.name] ?? [];
  console.log(
    `| ${mode.name} | ${fmt(median(xs))} | ${range(xs)} | ${((median(xs) / base) * 100).toFixed(0)} % | ${fmt(median(wal[mode.name] ?? []))} |`,
  );
}
for (const names of [before, after]) await pool.query(`DROP SCHEMA ${names.quotedSchema} CASCADE`);
await pool.end();
