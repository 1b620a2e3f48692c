import pg from "pg";
import { describe, expect, it } from "vitest";
import { migrate } from "../../src/migrate/migrator.js";
import { createPublisher } from "../../src/produce/publisher.js";
import { testDatabase } from "../support/database.js";
import { shippedMigrationsUpTo, versionsAfter } from "../support/migrations.js";
import { until } from "../support/worker.js";

/**
 * The per-key ordering upgrade (0003 + 0004, and 0007–0009 after it) on a live outbox: a table at version 2 holding rows, producers
 * publishing on their own connections the whole time, and `migrate` run in the middle. No producer may wait
 * for a good part of the upgrade, nor behind a lock request of it. bench/upgrade.ts runs the same scenario
 * at 1M rows for the figure in docs/reference/migration-history.md.
 */

const db = testDatabase("live");

const ROWS = 200_000;
/** Half of the rows are keyed, over this many keys (5 rows a key, 4 of them behind the key's head). */
const KEYS = 20_000;
const PRODUCERS = 4;
/**
 * At this size a migration that locks producers out while it builds an index stalls them for well under
 * 2 s, but for a good part of the upgrade (a quarter to a third with 0004's indexes built in a transaction),
 * while one that never holds them stalls them for a transaction's time, whatever the table's size: no stall
 * may exceed this share of the upgrade's duration (nor the floor, for a machine that upgrades very fast).
 */
const STALL_SHARE = 0.15;
const STALL_FLOOR_MS = 250;
const QUEUES = ["live.orders", "live.emails"] as const;

interface Commit {
  start: number;
  end: number;
}

/** Version 2: the shipped 0001 and 0002, byte for byte, so the full `migrate` later sees them as applied. */
async function schemaAtVersionTwo(schema: string = db.schema): Promise<void> {
  const result = await migrate({
    connection: db.pool,
    schema,
    migrationsDir: await shippedMigrationsUpTo(2),
  });
  expect(result.applied.map((m) => m.version)).toEqual([1, 2]);
}

/** Half keyed (queue follows the key, so each (queue, key) has ROWS / 2 / KEYS rows), ids in insert order. */
async function fill(schema: string): Promise<void> {
  await db.pool.query(
    `INSERT INTO "${schema}".messages (queue, payload, key)
     SELECT CASE WHEN g % 4 < 2 THEN $1 ELSE $2 END,
            jsonb_build_object('n', g, 'note', repeat('x', 48)),
            CASE WHEN g % 2 = 0 THEN 'k' || ((g / 2) % $3) END
     FROM generate_series(1, $4::int) AS g`,
    [QUEUES[0], QUEUES[1], KEYS, ROWS],
  );
  await db.pool.query(`ANALYZE "${schema}".messages`);
}

/**
 * Producers publishing one message a transaction, every other one keyed (mostly keys that already have
 * rows, some new ones), each on its own connection, until stopped. Every publish+commit is timed.
 */
function startProducers(url: string, schema: string) {
  const publisher = createPublisher({ schema, notify: { cooldownMs: 0 } });
  const commits: Commit[] = [];
  let stopping = false;
  const loops = Array.from({ length: PRODUCERS }, async (_, p) => {
    const client = new pg.Client({ connectionString: url, application_name: "migrate-live-producer" });
    await client.connect();
    try {
      for (let i = 0; !stopping; i++) {
        const keyed = i % 2 === 0;
        const k = Math.floor(Math.random() * KEYS * 1.1);
        const queue = QUEUES[keyed ? k % 2 : (i >> 1) % 2] ?? QUEUES[0];
        const start = performance.now();
        await client.query("BEGIN");
        await publisher.publish(client, queue, { producer: p, i }, keyed ? { key: `k${k}` } : undefined);
        await client.query("COMMIT");
        commits.push({ start, end: performance.now() });
      }
    } finally {
      await client.end();
    }
  });
  return {
    commits,
    async stop(): Promise<void> {
      stopping = true;
      await Promise.all(loops);
    },
  };
}

/** The upgrade's session waits for a lock on this schema's messages table (0003's ALTER TABLE). */
async function upgradeWaitsForLock(schema: string): Promise<boolean> {
  const { rows } = await db.pool.query(
    `SELECT count(*)::int AS n FROM pg_locks AS l JOIN pg_stat_activity AS a USING (pid)
     WHERE l.relation = to_regclass($1) AND NOT l.granted AND a.application_name = 'outbox-migrate'`,
    [`"${schema}".messages`],
  );
  return rows[0].n > 0;
}

function percentile(xs: number[], p: number): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1))] ?? Number.NaN;
}

describe("the per-key ordering upgrade on a live outbox", () => {
  it(`takes ${ROWS.toLocaleString("en-US")} rows from version 2 to the latest while producers keep committing`, {
    timeout: 180_000,
  }, async () => {
    const schema = db.schema;
    await schemaAtVersionTwo(schema);
    await fill(schema);
    const maxIdBefore = Number(
      (await db.pool.query(`SELECT max(id) AS id FROM "${schema}".messages`)).rows[0].id,
    );

    const producers = startProducers(db.url, schema);
    let result: Awaited<ReturnType<typeof migrate>>;
    const phases: { version: number; at: number }[] = [];
    let migrateStart = 0;
    let migrateEnd = 0;
    try {
      // A steady state first, so the stall of the upgrade is not a connection's first round trip.
      await until(() => producers.commits.length >= 200, "producers in their stride");
      migrateStart = performance.now();
      result = await migrate({
        connection: db.url,
        schema,
        onApplied: (m) => phases.push({ version: m.version, at: performance.now() }),
      });
      migrateEnd = performance.now();
      await until(
        () => producers.commits.filter((c) => c.start > migrateEnd).length >= 50,
        "producers going on after the upgrade",
      );
    } finally {
      await producers.stop();
    }

    expect(result.applied.map((m) => m.version)).toEqual(versionsAfter(2));
    const latencies = producers.commits.map((c) => c.end - c.start);
    const during = producers.commits.filter((c) => c.end >= migrateStart && c.start <= migrateEnd);
    const committedDuring = during.filter((c) => c.end <= migrateEnd).length;
    const at = (version: number) => phases.find((p) => p.version === version)?.at ?? migrateEnd;
    const after0003 = at(3);
    // After 0003: 0004's backfill UPDATE and concurrent index builds, and the migrations after it.
    const committedDuring0004 = during.filter((c) => c.start >= after0003 && c.end <= migrateEnd).length;
    const longest = Math.max(...latencies);
    const longestDuring = Math.max(...during.map((c) => c.end - c.start));
    const before = producers.commits.filter((c) => c.end < migrateStart).map((c) => c.end - c.start);
    console.log(
      `[migrate-live] ${ROWS.toLocaleString("en-US")} rows, ${PRODUCERS} producers: upgrade ${Math.round(migrateEnd - migrateStart)} ms ` +
        `(0003 ${Math.round(after0003 - migrateStart)} ms, 0004 ${Math.round(at(4) - after0003)} ms, ` +
        `0007–0009 ${Math.round(at(9) - at(6))} ms); ` +
        `${committedDuring} commits during it (${committedDuring0004} during 0004); ` +
        `longest producer stall ${Math.round(longestDuring)} ms during the upgrade, ${Math.round(longest)} ms overall ` +
        `(p99 ${percentile(latencies, 99).toFixed(1)} ms, before the upgrade max ${Math.round(Math.max(...before))} ms)`,
    );
    // Measured against the upgrade's own duration, which a busy machine stretches as it does the stalls.
    expect(longestDuring).toBeLessThan(Math.max(STALL_FLOOR_MS, STALL_SHARE * (migrateEnd - migrateStart)));
    // Producers kept going through the whole upgrade, not just around it.
    expect(committedDuring).toBeGreaterThan(50);
    expect(committedDuring0004).toBeGreaterThan(20);

    // Every keyed row with an earlier row of its key waits behind it; every other row heads its key. This
    // holds for the rows written before (the backfill) and during the upgrade (the trigger, and the
    // backfill for those written before 0003 committed) alike.
    const { rows } = await db.pool.query(
      `SELECT count(*) FILTER (WHERE key IS NULL AND NOT head)::int AS keyless_not_head,
              count(*) FILTER (WHERE key IS NOT NULL AND head <> (id = first_id))::int AS keyed_wrong,
              count(*) FILTER (WHERE key IS NOT NULL AND NOT head)::int AS waiting,
              count(*) FILTER (WHERE id > $1 AND key IS NOT NULL AND NOT head)::int AS new_waiting,
              count(*) FILTER (WHERE id > $1 AND key IS NOT NULL AND head)::int AS new_heads,
              count(*) FILTER (WHERE below_head)::int AS below_head
       FROM (SELECT id, key, head, below_head, min(id) OVER (PARTITION BY queue, key) AS first_id
             FROM "${schema}".messages) AS m`,
      [maxIdBefore],
    );
    // No row came in below its key's head (0007's mark): every producer here took the key's lock first.
    expect(rows[0]).toMatchObject({ keyless_not_head: 0, keyed_wrong: 0, below_head: 0 });
    expect(rows[0].waiting).toBeGreaterThanOrEqual(ROWS / 2 - KEYS);
    // The producers' rows took both branches: behind an existing key's rows, and heads of new keys.
    expect(rows[0].new_waiting).toBeGreaterThan(0);
    expect(rows[0].new_heads).toBeGreaterThan(0);

    const indexes = await db.pool.query(
      `SELECT c.relname AS name, i.indisvalid AS valid FROM pg_index AS i
       JOIN pg_class AS c ON c.oid = i.indexrelid
       WHERE i.indrelid = to_regclass($1)
         AND c.relname IN ('messages_ready_idx', 'messages_head_ready_idx', 'messages_waiting_idx',
                           'messages_leased_idx', 'messages_due_idx', 'messages_behind_idx',
                           'messages_dedupe_key_idx')
       ORDER BY 1`,
      [`"${schema}".messages`],
    );
    expect(indexes.rows).toEqual([
      // Dedupe keys' index (0020), built concurrently on the live table too.
      { name: "messages_behind_idx", valid: true },
      { name: "messages_dedupe_key_idx", valid: true },
      // The due indexes of HOT leases (0021) replace the ready, waiting and leased ones, built concurrently.
      { name: "messages_due_idx", valid: true },
    ]);
  });

  it("waits out a long transaction on messages without holding producers behind its table lock", {
    timeout: 180_000,
  }, async () => {
    const schema = db.freshSchema("long");
    await schemaAtVersionTwo(schema);
    const reader = new pg.Client({ connectionString: db.url });
    await reader.connect();
    const producers = startProducers(db.url, schema);
    const AFTER = 20;
    try {
      await until(() => producers.commits.length >= 100, "producers in their stride");
      // A report, a slow consumer, a psql session left open: any transaction that read messages holds a
      // lock 0003's ALTER TABLE conflicts with, until it ends.
      await reader.query("BEGIN");
      await reader.query(`SELECT count(*) FROM "${schema}".messages`);
      const upgrade = migrate({ connection: db.url, schema });
      // Awaited below; a failure meanwhile must not surface as an unhandled rejection.
      upgrade.catch(() => {});
      await until(() => upgradeWaitsForLock(schema), "the upgrade waiting for the reader's lock", 60_000);
      const queuedAt = performance.now();
      // A lock request left queued behind the reader would hold every producer that comes after it until the
      // reader ends; given up (lock_timeout) and retried later, it lets them through in between.
      await until(
        () => producers.commits.filter((c) => c.start > queuedAt).length >= AFTER,
        `${AFTER} commits begun after the upgrade asked for its lock, the reader still open`,
        60_000,
      );
      await reader.query("COMMIT");
      const result = await upgrade;
      expect(result.applied.map((m) => m.version)).toEqual(versionsAfter(2));
    } finally {
      await reader.end();
      await producers.stop();
    }
    const longest = Math.max(...producers.commits.map((c) => c.end - c.start));
    console.log(`[migrate-live] behind a long transaction: longest producer stall ${Math.round(longest)} ms`);
  });
});
