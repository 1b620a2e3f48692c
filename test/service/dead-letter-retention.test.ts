import { writeFile } from "node:fs/promises";
import path from "node:path";
import type pg from "pg";
import { Registry } from "prom-client";
import { afterEach, beforeAll, describe, expect, it } from "vitest";
import { queueStatus } from "../../src/inspect/status.js";
import { migrate } from "../../src/migrate/migrator.js";
import { ConfigError, loadServiceConfig } from "../../src/service/config.js";
import {
  createDeadLetterRetention,
  type DeadLetterRetention,
  type DeadLetterRetentionOptions,
} from "../../src/service/dead-letter-retention.js";
import { createMetrics } from "../../src/service/metrics.js";
import { startService } from "../../src/service/service.js";
import type { PgQueryable } from "../../src/sql/executor.js";
import { outboxNames } from "../../src/sql/names.js";
import { testDatabase } from "../support/database.js";
import { memoryLogger } from "../support/memory-logger.js";
import { testTempDir } from "../support/temp-dir.js";
import { until } from "../support/worker.js";

const db = testDatabase("dlr");
const DAY_MS = 86_400_000;
const RETENTION_MS = 7 * DAY_MS;

beforeAll(() => db.migrate());

const stops: (() => Promise<unknown>)[] = [];
afterEach(async () => {
  for (const stop of stops.splice(0).reverse()) await stop().catch(() => {});
});

/** A fresh, migrated schema of this file's, empty. */
async function emptySchema(tag: string): Promise<string> {
  const schema = db.freshSchema(tag);
  await migrate({ connection: db.pool, schema });
  return schema;
}

let nextId = 1;
/** `count` dead letters of `queue` that died `age` ago (a Postgres interval); their ids. */
async function deadLetters(schema: string, queue: string, count: number, age: string): Promise<string[]> {
  const { rows } = await db.pool.query<{ id: string }>(
    `INSERT INTO ${outboxNames(schema).deadLetters} (id, queue, payload, headers, created_at, available_at,
       deliveries_count, attempts_count, dead_at, reason)
     SELECT $1::bigint + g, $2, '{}', '{}', now() - $4::interval, now() - $4::interval, 1, 1,
            now() - $4::interval, 'rejected'
     FROM generate_series(0, $3::int - 1) AS g
     RETURNING id`,
    [nextId, queue, count, age],
  );
  nextId += count;
  return rows.map((r) => r.id).sort();
}

async function remainingIds(schema: string): Promise<string[]> {
  const { rows } = await db.pool.query<{ id: string }>(
    `SELECT id FROM ${outboxNames(schema).deadLetters} ORDER BY id`,
  );
  return rows.map((r) => r.id).sort();
}

/** The pool, counting the retention's deletes and the most rows one of them removed. */
function countingPool(fail: () => boolean = () => false) {
  const seen = { deletes: 0, mostRows: 0 };
  const pool: PgQueryable = {
    async query(config) {
      if (fail()) throw new Error("connection terminated unexpectedly");
      const result = await db.pool.query(config as pg.QueryConfig);
      // A retention batch: the delete runs inside expire_dead_letters (migration 0015), as the owner.
      if (config.text.includes("expire_dead_letters(")) {
        seen.deletes++;
        const rows = result.rows as { deleted: number }[];
        seen.mostRows = Math.max(
          seen.mostRows,
          rows.reduce((n, r) => n + r.deleted, 0),
        );
      }
      return result;
    },
  };
  return { pool, seen };
}

function retention(options: Partial<DeadLetterRetentionOptions> & { schema: string }): DeadLetterRetention {
  const job = createDeadLetterRetention({
    pool: db.pool,
    retentionMs: RETENTION_MS,
    batchSize: 3,
    pauseMs: 1,
    queryTimeoutMs: 10_000,
    logger: memoryLogger().logger,
    ...options,
  });
  stops.push(() => job.stop());
  return job;
}

/** Rejects when `promise` has not settled after `ms`: a statement waiting on a lock it should skip. */
function within<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
  return Promise.race([
    promise,
    new Promise<never>((_, reject) =>
      setTimeout(() => reject(new Error(`${what}: still waiting after ${ms} ms`)), ms),
    ),
  ]);
}

describe("dead-letter retention", () => {
  it("deletes exactly the dead letters older than the retention, in batches, counts and logs them", async () => {
    const schema = await emptySchema("old");
    const oldOrders = await deadLetters(schema, "orders", 7, "10 days");
    const oldMail = await deadLetters(schema, "mail", 3, "8 days");
    // Just inside the retention, and recent ones: all kept.
    const kept = [
      ...(await deadLetters(schema, "orders", 1, "6 days 23 hours")),
      ...(await deadLetters(schema, "orders", 2, "1 hour")),
      ...(await deadLetters(schema, "mail", 1, "1 minute")),
    ].sort();
    const { pool, seen } = countingPool();
    const { logger, lines } = memoryLogger();
    const metrics = createMetrics({ pool: db.pool, schema, registry: new Registry(), collectDefault: false });
    const job = retention({ schema, pool, logger });
    metrics.observeRetention(job);

    const run = await job.runOnce();

    expect(run.error).toBeUndefined();
    expect(run.deleted).toBe(oldOrders.length + oldMail.length);
    expect(run.byQueue).toEqual({ orders: 7, mail: 3 });
    // 10 rows, 3 a statement: 3 + 3 + 3 + 1, never more than a batch at once.
    expect(run.batches).toBe(4);
    expect(seen.deletes).toBe(4);
    expect(seen.mostRows).toBe(3);
    expect(await remainingIds(schema)).toEqual(kept);

    const counter = await metrics.registry.getSingleMetric("outbox_dead_letters_expired_total")?.get();
    const byQueue = Object.fromEntries((counter?.values ?? []).map((v) => [v.labels.queue, v.value]));
    expect(byQueue).toEqual({ orders: 7, mail: 3 });

    const info = lines.filter((l) => l.msg === "expired dead letters deleted");
    expect(info).toHaveLength(1);
    expect(info[0]).toMatchObject({ deleted: 10, batches: 4, byQueue: { orders: 7, mail: 3 } });
    // The oldest kept is the one just inside the retention.
    expect(info[0]?.oldestKeptAgeS).toBeGreaterThan(6 * 86_400);
    expect(info[0]?.oldestKeptAgeS).toBeLessThan(7 * 86_400);

    // Nothing old left: one statement, no line.
    const again = await job.runOnce();
    expect(again).toMatchObject({ deleted: 0, batches: 1 });
    expect(lines.filter((l) => l.msg === "expired dead letters deleted")).toHaveLength(1);
  });

  it("skips a dead letter another transaction holds, without waiting, and takes it on the next run", async () => {
    const schema = await emptySchema("lock");
    const old = await deadLetters(schema, "orders", 5, "30 days");
    const recent = await deadLetters(schema, "orders", 2, "1 day");
    const lockedId = old[2] as string;
    const holder = await db.pool.connect();
    const job = retention({ schema });
    try {
      // A replay or a person's purge in progress: the row is locked until its transaction ends.
      await holder.query("BEGIN");
      await holder.query(`SELECT id FROM ${outboxNames(schema).deadLetters} WHERE id = $1 FOR UPDATE`, [
        lockedId,
      ]);

      const run = await within(job.runOnce(), 30_000, "retention run with a locked dead letter");
      expect(run.error).toBeUndefined();
      expect(run.deleted).toBe(4);
      expect(await remainingIds(schema)).toEqual([lockedId, ...recent].sort());
    } finally {
      await holder.query("ROLLBACK").catch(() => {});
      holder.release();
    }
    const next = await job.runOnce();
    expect(next.deleted).toBe(1);
    expect(await remainingIds(schema)).toEqual(recent);
  });

  it("is harmless with several replicas running at once: every old row deleted once, no error", async () => {
    const schema = await emptySchema("rep");
    await deadLetters(schema, "orders", 40, "9 days");
    const recent = await deadLetters(schema, "orders", 3, "2 days");
    const jobs = [1, 2, 3].map(() => retention({ schema, batchSize: 4 }));
    const runs = await within(
      Promise.all(jobs.map((j) => j.runOnce())),
      30_000,
      "three replicas' retention runs",
    );
    expect(runs.map((r) => r.error)).toEqual([undefined, undefined, undefined]);
    // A replica may stop early on a batch shortened by the others' locks; what is left goes next run.
    const total = runs.reduce((n, r) => n + r.deleted, 0);
    const leftOld = (await remainingIds(schema)).length - recent.length;
    expect(total + leftOld).toBe(40);
    await Promise.all(jobs.map((j) => j.runOnce()));
    expect(await remainingIds(schema)).toEqual(recent);
  });

  it("runs on its cadence and survives a failed run with one warning", async () => {
    const schema = await emptySchema("tick");
    await deadLetters(schema, "orders", 5, "20 days");
    let failures = 1;
    const { pool } = countingPool(() => failures-- > 0);
    const { logger, lines } = memoryLogger();
    const expired: number[] = [];
    const job = retention({ schema, pool, logger, intervalMs: 20, jitterMs: 5 });
    job.onExpired((e) => expired.push(e.count));
    job.start();

    // The run's line comes after its last batch: waiting for it, not the count, leaves no race.
    await until(
      () => lines.some((l) => l.msg === "expired dead letters deleted"),
      "the next run after the failure deletes the rows",
    );
    expect(expired.reduce((a, b) => a + b, 0)).toBe(5);
    expect(lines.find((l) => l.msg === "expired dead letters deleted")).toMatchObject({ deleted: 5 });
    const warns = lines.filter((l) => l.level === 40);
    expect(warns).toHaveLength(1);
    expect(warns[0]?.msg).toBe("dead-letter retention failed; the next run tries again");
    expect(await remainingIds(schema)).toEqual([]);
  });

  it("stop ends a long run after its current batch, without sitting out the pause", async () => {
    const schema = await emptySchema("stop");
    const old = await deadLetters(schema, "orders", 3, "20 days");
    const job = retention({ schema, batchSize: 1, pauseMs: 600_000 });
    let deleted = 0;
    job.onExpired((e) => {
      deleted += e.count;
    });
    const run = job.runOnce();
    await until(() => deleted === 1, "the first batch");
    await within(job.stop(), 60_000, "stop during the pause between batches");
    expect(await run).toMatchObject({ deleted: 1, batches: 1 });
    expect(await remainingIds(schema)).toEqual(old.slice(1));
  });
});

describe("status: the oldest dead letter's age", () => {
  it("queueStatus gives it per queue; null for a queue without dead letters", async () => {
    const schema = await emptySchema("st");
    await deadLetters(schema, "orders", 2, "3 days");
    await deadLetters(schema, "orders", 1, "1 hour");
    await db.pool.query(`INSERT INTO ${outboxNames(schema).messages} (queue, payload) VALUES ('mail', '{}')`);
    const rows = await queueStatus(db.pool, schema);
    expect(rows.map((r) => [r.queue, r.dead])).toEqual([
      ["mail", 0],
      ["orders", 3],
    ]);
    expect(rows[0]?.oldest_dead_age_s).toBeNull();
    expect(rows[1]?.oldest_dead_age_s).toBeGreaterThanOrEqual(3 * 86_400);
    expect(rows[1]?.oldest_dead_age_s).toBeLessThan(3 * 86_400 + 60);
  });
});

describe("deadLetterRetentionMs config", () => {
  async function problems(env: Record<string, string>, file?: string): Promise<string[]> {
    try {
      await loadServiceConfig({ env, file });
    } catch (error) {
      if (error instanceof ConfigError) return error.problems;
      throw error;
    }
    throw new Error("expected a ConfigError");
  }

  it("is off by default and read from OUTBOX_DEAD_LETTER_RETENTION_MS in milliseconds", async () => {
    expect((await loadServiceConfig({ env: {} })).deadLetterRetentionMs).toBeUndefined();
    const config = await loadServiceConfig({ env: { OUTBOX_DEAD_LETTER_RETENTION_MS: "604800000" } });
    expect(config.deadLetterRetentionMs).toBe(RETENTION_MS);
  });

  it("refuses a bad value, naming the field and its variable", async () => {
    expect(await problems({ OUTBOX_DEAD_LETTER_RETENTION_MS: "7d" })).toEqual([
      'deadLetterRetentionMs (OUTBOX_DEAD_LETTER_RETENTION_MS): expected a whole number, got "7d"',
    ]);
    // Days or hours meant, milliseconds read: refused rather than deleting almost every dead letter.
    expect(await problems({ OUTBOX_DEAD_LETTER_RETENTION_MS: "7" })).toEqual([
      "deadLetterRetentionMs (OUTBOX_DEAD_LETTER_RETENTION_MS): must be at least 3600000 (1 hour): the value is in milliseconds, e.g. 604800000 for 7 days",
    ]);
    const file = path.join(await testTempDir("outbox-retention-"), "c.json");
    await writeFile(file, JSON.stringify({ deadLetterRetentionMs: "30 days" }));
    const [fromFile] = await problems({}, file);
    expect(fromFile).toMatch(/^deadLetterRetentionMs \(OUTBOX_DEAD_LETTER_RETENTION_MS\): .*expected number/);
  });

  it("the service starts the job with it and stops it on shutdown", async () => {
    const schema = await emptySchema("svc");
    const { logger, lines } = memoryLogger();
    const config = await loadServiceConfig({
      env: {
        DATABASE_URL: db.url,
        OUTBOX_SCHEMA: schema,
        OUTBOX_HANDLERS: path.resolve("test/support/fixtures/handlers.ts"),
        OUTBOX_DEAD_LETTER_RETENTION_MS: String(RETENTION_MS),
      },
    });
    const service = await startService(config, logger);
    try {
      expect(lines.find((l) => l.msg.startsWith("dead-letter retention on"))).toMatchObject({
        retentionMs: RETENTION_MS,
        intervalMs: 60_000,
      });
    } finally {
      await within(service.stop(), 60_000, "service stop");
    }
  });
});
