/**
 * An upgrade on a live outbox, at production size: a schema at version `--from` (default 2: the per-key
 * ordering upgrade, migrations 0003 to 0009; 20: the HOT leases of 0021) holding 1,000,000 rows (half keyed,
 * over 100,000 keys), 4 producers publishing one message a transaction the whole time, and `migrate` run in
 * the middle. Prints how long the upgrade took (and each
 * of its statements that ran long enough to be seen), the producers' longest and p99 publish+commit while
 * it ran, and how many commits they made during it. test/migrate/migrate-live.test.ts runs the same at 200k rows.
 *
 *   DATABASE_URL=postgres://postgres@127.0.0.1:5432/test npx tsx bench/upgrade.ts [--rows 1000000] [--keys 100000] [--from 2]
 */
import { copyFile, mkdtemp, readdir, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import pg from "pg";
import { MIGRATIONS_DIR } from "../src/migrate/migration-files.js";
import { migrate } from "../src/migrate/migrator.js";
import { createPublisher } from "../src/produce/publisher.js";
import { outboxNames } from "../src/sql/names.js";
import { arg, DATABASE_URL, fmt, machine, PAYLOAD_SQL, payload, percentile, sleep } from "./lib.js";

const ROWS = Number(arg("rows", "1000000"));
const KEYS = Number(arg("keys", "100000"));
const FROM = Number(arg("from", "2"));
const PRODUCERS = 4;
const QUEUES = ["bench.orders", "bench.emails"] as const;
const schema = "bench_upgrade";
const names = outboxNames(schema);

interface Commit {
  start: number;
  end: number;
}

/** Version FROM: the shipped files up to it, byte for byte, so the full `migrate` later sees them as applied. */
async function schemaAtVersion(): Promise<void> {
  const dir = await mkdtemp(path.join(tmpdir(), "outbox-bench-migrations-"));
  try {
    const upTo = (f: string) => /^\d{4}_\w+\.sql$/.test(f) && Number(f.slice(0, 4)) <= FROM;
    for (const file of (await readdir(MIGRATIONS_DIR)).filter(upTo)) {
      await copyFile(path.join(MIGRATIONS_DIR, file), path.join(dir, file));
    }
    await migrate({ connection: DATABASE_URL, schema, migrationsDir: dir });
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

/** Every other publish keyed: mostly keys that already have rows, some new ones. */
function startProducers() {
  const publisher = createPublisher({ schema, notify: { cooldownMs: 0 } });
  const commits: Commit[] = [];
  let stopping = false;
  const loops = Array.from({ length: PRODUCERS }, async () => {
    const client = new pg.Client({
      connectionString: DATABASE_URL,
      application_name: "bench-upgrade-producer",
    });
    await client.connect();
    try {
      for (let i = 0; !stopping; i++) {
        const keyed = i % 2 === 0;
        const k = Math.floor(Math.random() * KEYS * 1.1);
        const queue = QUEUES[keyed ? k % 2 : (i >> 1) % 2] ?? QUEUES[0];
        const start = performance.now();
        await client.query("BEGIN");
        await publisher.publish(client, queue, payload(i), keyed ? { key: `k${k}` } : undefined);
        await client.query("COMMIT");
        commits.push({ start, end: performance.now() });
      }
    } finally {
      await client.end();
    }
  });
  return {
    commits,
    async stop() {
      stopping = true;
      await Promise.all(loops);
    },
  };
}

/** Samples what the migrator's connection runs, to time each statement that lasts a poll or more. */
function watchMigrator(pool: pg.Pool) {
  const seen = new Map<string, { label: string; first: number; last: number }>();
  let stopping = false;
  const loop = (async () => {
    while (!stopping) {
      const { rows } = await pool.query<{ started: string; query: string }>(
        `SELECT query_start::text AS started, query FROM pg_stat_activity
         WHERE application_name = 'outbox-migrate' AND state = 'active'`,
      );
      const now = performance.now();
      for (const row of rows) {
        const id = `${row.started} ${row.query.length}`;
        const entry = seen.get(id);
        if (entry) entry.last = now;
        else seen.set(id, { label: row.query.replace(/\s+/g, " ").slice(0, 72), first: now, last: now });
      }
      await sleep(20);
    }
  })();
  return {
    async stop() {
      stopping = true;
      await loop;
      return [...seen.values()];
    },
  };
}

const pool = new pg.Pool({ connectionString: DATABASE_URL, max: 4 });
try {
  console.log(await machine(pool));
  await pool.query(`DROP SCHEMA IF EXISTS ${names.quotedSchema} CASCADE`);
  await schemaAtVersion();
  const t = performance.now();
  if (FROM < 3) {
    await pool.query(
      `INSERT INTO ${names.messages} (queue, payload, key)
       SELECT CASE WHEN g % 4 < 2 THEN $1 ELSE $2 END, ${PAYLOAD_SQL},
              CASE WHEN g % 2 = 0 THEN 'k' || ((g / 2) % $3) END
       FROM generate_series(1, $4::int) AS g`,
      [QUEUES[0], QUEUES[1], KEYS, ROWS],
    );
  } else {
    // The key-head trigger takes a lock per key until commit: one fill statement over 100k keys would
    // exhaust the lock table. The fill sets head itself (key k first appears at g / 2 = k, k = 0 at KEYS).
    const client = await pool.connect();
    try {
      await client.query("BEGIN");
      await client.query(`ALTER TABLE ${names.messages} DISABLE TRIGGER messages_key_head`);
      await client.query(
        `INSERT INTO ${names.messages} (queue, payload, key, head)
         SELECT CASE WHEN g % 4 < 2 THEN $1 ELSE $2 END, ${PAYLOAD_SQL},
                CASE WHEN g % 2 = 0 THEN 'k' || ((g / 2) % $3) END, g % 2 = 1 OR g / 2 <= $3
         FROM generate_series(1, $4::int) AS g`,
        [QUEUES[0], QUEUES[1], KEYS, ROWS],
      );
      await client.query(`ALTER TABLE ${names.messages} ENABLE TRIGGER messages_key_head`);
      await client.query("COMMIT");
    } finally {
      client.release();
    }
  }
  // As a production table would be: vacuumed and analysed, its pages on disk.
  await pool.query(`VACUUM (ANALYZE) ${names.messages}`);
  await pool.query("CHECKPOINT");
  const size = (await pool.query(`SELECT pg_size_pretty(pg_total_relation_size($1)) AS s`, [names.messages]))
    .rows[0].s;
  console.log(
    `version ${FROM}, ${fmt(ROWS)} rows (${fmt(ROWS / 2)} keyed over ${fmt(KEYS)} keys), ${size} with indexes, filled in ${fmt((performance.now() - t) / 1000, 1)} s`,
  );

  const producers = startProducers();
  const phases: { version: number; at: number }[] = [];
  let migrateStart = 0;
  let migrateEnd = 0;
  let statements: { label: string; first: number; last: number }[] = [];
  try {
    await sleep(2_000);
    const watch = watchMigrator(pool);
    migrateStart = performance.now();
    const result = await migrate({
      connection: DATABASE_URL,
      schema,
      onApplied: (m) => phases.push({ version: m.version, at: performance.now() }),
    });
    migrateEnd = performance.now();
    statements = await watch.stop();
    console.log(`applied ${result.applied.map((m) => m.name).join(", ")}`);
    await sleep(1_000);
  } finally {
    await producers.stop();
  }

  const all = producers.commits;
  const during = all.filter((c) => c.end >= migrateStart && c.start <= migrateEnd);
  const latencies = during.map((c) => c.end - c.start);
  const before = all.filter((c) => c.end < migrateStart && c.start >= migrateStart - 2_000);
  const seconds = (migrateEnd - migrateStart) / 1000;
  const committed = during.filter((c) => c.end <= migrateEnd).length;
  const last = Math.max(...phases.map((p) => p.version));
  const each = phases.map(
    (p, i) => `${String(p.version).padStart(4, "0")} ${fmt(p.at - (phases[i - 1]?.at ?? migrateStart))} ms`,
  );
  console.log(`\nupgrade ${FROM} → ${last}: ${fmt(seconds, 1)} s (${each.join(", ")})`);
  for (const s of statements) {
    if (s.last - s.first >= 100) console.log(`  ~${fmt((s.last - s.first) / 1000, 1)} s  ${s.label}`);
  }
  const beforeLatencies = before.map((c) => c.end - c.start);
  console.log(
    `producers (${PRODUCERS}, one publish a transaction): ${fmt(committed)} commits during the upgrade (${fmt(committed / seconds)}/s; ${fmt(before.length / 2)}/s before it)`,
  );
  console.log(
    `publish+commit during the upgrade: longest ${fmt(Math.max(...latencies))} ms, p99 ${fmt(percentile(latencies, 99), 1)} ms, median ${fmt(percentile(latencies, 50), 1)} ms` +
      ` (before it: longest ${fmt(Math.max(...beforeLatencies))} ms, p99 ${fmt(percentile(beforeLatencies, 99), 1)} ms)`,
  );

  const check = await pool.query(
    `SELECT count(*) FILTER (WHERE key IS NULL AND NOT head)::int
          + count(*) FILTER (WHERE key IS NOT NULL AND head <> (id = first_id))::int AS wrong,
            count(*) FILTER (WHERE NOT head)::int AS waiting,
            count(*) FILTER (WHERE below_head)::int AS below
     FROM (SELECT id, key, head, below_head, min(id) OVER (PARTITION BY queue, key) AS first_id
           FROM ${names.messages}) AS m`,
  );
  console.log(
    `after: ${fmt(check.rows[0].waiting)} rows wait behind their key's head, ${check.rows[0].wrong} rows marked wrong, ` +
      `${check.rows[0].below} marked below their key's head`,
  );
} finally {
  await pool.query(`DROP SCHEMA IF EXISTS ${names.quotedSchema} CASCADE`).catch(() => {});
  await pool.end();
}
