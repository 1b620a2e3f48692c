import path from "node:path";
import { afterEach, beforeAll, describe, expect, it } from "vitest";
import { serviceConfigSchema } from "../../src/service/config.js";
import { startService } from "../../src/service/service.js";
import { createUnservedQueueWatch } from "../../src/service/unserved-queues.js";
import { runQuery } from "../../src/sql/executor.js";
import { staleQueuesStatement } from "../../src/sql/inspect.js";
import { testDatabase } from "../support/database.js";
import { memoryLogger } from "../support/memory-logger.js";
import { until, workerFactory } from "../support/worker.js";

/**
 * A message on a queue no running worker serves waits forever: the service says so, once per queue, from
 * the database alone (another service may serve queues this one does not know), and again only after the
 * queue was taken from again and is left alone once more. Ages are made by back-dating available_at.
 */
const db = testDatabase("unserved");
const workers = workerFactory({ url: db.url, schema: db.schema });
const WARN_AFTER_MS = 5 * 60_000;
const UNSERVED = "no worker takes from";

beforeAll(() => db.migrate());
afterEach(() => db.pool.query(`DELETE FROM ${db.names.messages}`));

/** `n` ready messages on `queue`, deliverable for `ageMs` already. */
async function waiting(queue: string, n: number, ageMs: number): Promise<void> {
  await db.pool.query(
    `INSERT INTO ${db.names.messages} (queue, payload, available_at)
     SELECT $1, jsonb_build_object('i', i), now() - make_interval(secs => $2::float8 / 1000)
     FROM generate_series(1, $3) AS i`,
    [queue, ageMs, n],
  );
}

function watchWithLog(servedHere: string[] = []) {
  const { logger, lines } = memoryLogger();
  const watch = createUnservedQueueWatch({
    pool: db.pool,
    schema: db.schema,
    warnAfterMs: WARN_AFTER_MS,
    intervalMs: 3_600_000,
    servedHere: new Set(servedHere),
    logger,
  });
  return {
    watch,
    /** The queues warned about so far, one entry per warning. */
    warned: () => lines.filter((l) => l.level === 40).map((l) => l.queue),
    recovered: () => lines.filter((l) => l.level === 30).map((l) => l.queue),
    lines,
  };
}

describe("the unserved-queue watch", () => {
  it("warns once per queue left waiting past the threshold, with its age; again only after it recovered", async () => {
    await waiting("orphan", 3, 10 * 60_000);
    await waiting("fresh", 3, 1000);
    await waiting("future", 1, -60 * 60_000);
    const { watch, warned, recovered, lines } = watchWithLog();

    // Seen once: a worker between two batches holds no lease for a moment; not yet a warning.
    await watch.check();
    expect(warned()).toEqual([]);
    await watch.check();
    expect(warned()).toEqual(["orphan"]);
    const [line] = lines.filter((l) => l.level === 40);
    expect(line?.msg).toContain(UNSERVED);
    expect(line?.oldestReadyAgeS).toBeGreaterThanOrEqual(600);
    expect(line?.oldestReadyAgeS).toBeLessThan(3600);
    expect(line?.servedHere).toBe(false);
    // Once: still unserved at later checks, no second line.
    await watch.check();
    await watch.check();
    expect(warned()).toEqual(["orphan"]);

    // Taken from (its rows gone): one info line; left waiting again later: a new warning.
    await db.pool.query(`DELETE FROM ${db.names.messages} WHERE queue = 'orphan'`);
    await watch.check();
    expect(recovered()).toEqual(["orphan"]);
    await waiting("orphan", 1, 6 * 60_000);
    await watch.check();
    expect(warned()).toEqual(["orphan"]);
    await watch.check();
    expect(warned()).toEqual(["orphan", "orphan"]);
    await watch.stop();
  });

  // leaseMode "transaction" writes no lease on the rows: its batch's guard must count as one (migration 0024).
  it.each(["token", "transaction"] as const)(
    "is right with several services: a queue another service takes from is not unserved until it stops (leaseMode %s)",
    async (leaseMode) => {
      await waiting("elsewhere", 5, 10 * 60_000);
      // Another service's worker: it knows "elsewhere", the watch's service does not. Its handler holds on,
      // so its lease is live (renewed) for as long as the test wants.
      let release = () => {};
      const holding = new Promise<void>((resolve) => {
        release = resolve;
      });
      let started = 0;
      const other = await workers.start({
        queues: {
          elsewhere: async () => {
            started++;
            await holding;
          },
        },
        concurrency: 1,
        batchSize: 1,
        leaseMode,
      });
      await until(() => started > 0, "the other service's worker holds a message of its queue");

      const { watch, warned } = watchWithLog(["mine"]);
      try {
        for (let i = 0; i < 3; i++) await watch.check();
        expect(warned()).toEqual([]);
      } finally {
        // That service goes away: its queue has no worker any more, and its messages still wait.
        // Stopping first: the messages it fetched but did not start go back, as a service's stop does.
        // (Also on a failure: a transaction-held batch would keep the cleanup's DELETE waiting.)
        const stopped = other.stop({ timeoutMs: 5000 });
        release();
        await stopped;
      }
      await db.pool.query(
        `UPDATE ${db.names.messages} SET available_at = now() - interval '10 minutes' WHERE queue = 'elsewhere'`,
      );
      await watch.check();
      await watch.check();
      expect(warned()).toEqual(["elsewhere"]);
      await watch.stop();
    },
  );

  it("names a queue this service serves as its own, with a hint at its fetches", async () => {
    await waiting("mine", 1, 10 * 60_000);
    const { watch, lines } = watchWithLog(["mine"]);
    await watch.check();
    await watch.check();
    const warnings = lines.filter((l) => l.level === 40);
    expect(warnings.map((l) => [l.queue, l.servedHere])).toEqual([["mine", true]]);
    expect(warnings[0]?.msg).toContain("this service serves");
    await watch.stop();
  });

  it("reads indexes only, however large the backlog", async () => {
    await db.pool.query(
      `INSERT INTO ${db.names.messages} (queue, payload, available_at)
       SELECT 'q' || (i % 4), '{}', now() - interval '1 hour' FROM generate_series(1, 60000) AS i`,
    );
    await db.pool.query(`ANALYZE ${db.names.messages}`);
    const { text } = staleQueuesStatement(db.names).statement;
    const { rows } = await db.pool.query(`EXPLAIN (FORMAT JSON) ${text}`, [WARN_AFTER_MS]);
    // How each node reads messages (lease_guards, a few rows of live batches, may be scanned).
    const reads: string[] = [];
    const walk = (node: { "Node Type": string; "Relation Name"?: string; Plans?: unknown[] }) => {
      if (node["Relation Name"] === "messages") reads.push(node["Node Type"]);
      for (const child of node.Plans ?? []) walk(child as typeof node);
    };
    walk(rows[0]["QUERY PLAN"][0].Plan);
    expect(reads.length).toBeGreaterThan(0);
    expect(reads.filter((t) => !t.startsWith("Index"))).toEqual([]);
    const found = await runQuery(db.pool, staleQueuesStatement(db.names), { olderThanMs: WARN_AFTER_MS });
    expect(found.map((r) => [r.queue, r.leased])).toEqual([
      ["q0", false],
      ["q1", false],
      ["q2", false],
      ["q3", false],
    ]);
  });
});

describe("the service", () => {
  it("runs the watch: a message on a queue it does not serve gets its warning", async () => {
    await waiting("nobody-serves-this", 1, 10 * 60_000);
    const { logger, lines } = memoryLogger();
    const config = serviceConfigSchema.parse({
      databaseUrl: db.url,
      schema: db.schema,
      handlers: path.resolve("test/support/fixtures/handlers.ts"),
      http: { gaugeIntervalMs: 100 },
    });
    expect(config.unservedQueueWarnMs).toBe(WARN_AFTER_MS);
    const service = await startService(config, logger);
    try {
      await until(
        () => lines.some((l) => l.msg.includes(UNSERVED)),
        "the warning for the queue no one serves",
        30_000,
      );
      const warnings = lines.filter((l) => l.msg.includes(UNSERVED));
      expect(warnings.map((l) => l.queue)).toEqual(["nobody-serves-this"]);
    } finally {
      await service.stop();
    }
  });

  it("refuses a threshold that would mistake a busy queue for an unserved one, naming the field", () => {
    const parsed = serviceConfigSchema.safeParse({ unservedQueueWarnMs: 500 });
    expect(parsed.success).toBe(false);
    expect(parsed.error?.issues[0]?.path).toEqual(["unservedQueueWarnMs"]);
    expect(parsed.error?.issues[0]?.message).toBe("must be 0 (off) or at least 1000 (1 s)");
    expect(serviceConfigSchema.parse({ unservedQueueWarnMs: 0 }).unservedQueueWarnMs).toBe(0);
  });
});
