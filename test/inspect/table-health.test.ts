import path from "node:path";
import { beforeAll, describe, expect, it } from "vitest";
import { tableHealth } from "../../src/inspect/table-health.js";
import { serviceConfigSchema } from "../../src/service/config.js";
import { startService } from "../../src/service/service.js";
import { startCli } from "../support/cli-process.js";
import { testDatabase } from "../support/database.js";
import { memoryLogger } from "../support/memory-logger.js";
import { until } from "../support/worker.js";

/** Dead tuples slow pickup: the messages table's health is visible in status, /metrics and at start. */
const db = testDatabase("health");

beforeAll(async () => {
  await db.migrate();
  // Dead tuples to show: rows inserted and deleted (as every delivered message is).
  await db.pool.query(
    `INSERT INTO ${db.names.messages} (queue, payload) SELECT 'h', '{}' FROM generate_series(1, 200)`,
  );
  await db.pool.query(`DELETE FROM ${db.names.messages}`);
  // The cumulative statistics arrive a moment after the session goes idle.
  await until(
    async () => ((await tableHealth(db.pool, db.schema))?.dead_tuples ?? 0) >= 200,
    "dead tuples counted",
  );
});

describe("table health", () => {
  it("status prints the messages table's dead tuples, size, last vacuum and autovacuum state", async () => {
    const p = startCli(["status", "--schema", db.schema], { DATABASE_URL: db.url });
    expect((await p.exited).code).toBe(0);
    expect(p.output()).toMatch(
      /messages table: [\d,]+ dead tuples, \d+ live, [\d.]+ [kMG]B, (never vacuumed|last vacuum .+ ago), (autovacuum on|AUTOVACUUM OFF)/,
    );
    const dead = Number(/messages table: ([\d,]+) dead/.exec(p.output())?.[1]?.replaceAll(",", ""));
    expect(dead).toBeGreaterThanOrEqual(200);
  });

  it("reports autovacuum off when it is switched off for the table, and the service warns at start", async () => {
    await db.pool.query(`ALTER TABLE ${db.names.messages} SET (autovacuum_enabled = false)`);
    try {
      expect((await tableHealth(db.pool, db.schema))?.autovacuum_enabled).toBe(false);
      const { lines, logger } = memoryLogger();
      const config = serviceConfigSchema.parse({
        databaseUrl: db.url,
        schema: db.schema,
        handlers: path.resolve("test/support/fixtures/handlers.ts"),
        http: { port: 0, host: "127.0.0.1", gaugeIntervalMs: 100 },
      });
      const service = await startService(config, logger);
      try {
        const warnings = lines.filter((l) => l.level === 40 && l.msg.startsWith("autovacuum is off"));
        expect(warnings).toHaveLength(1);
        expect(warnings[0]?.health).toMatch(/AUTOVACUUM OFF/);
        // And /metrics says the same, with the dead tuples.
        let metrics = "";
        // A gauge reads 0 until its first refresh: the table's size, never 0 once read, tells it was.
        await until(async () => {
          metrics = await (await fetch(`http://127.0.0.1:${service.httpPort}/metrics`)).text();
          return /outbox_table_size_bytes [1-9]/.test(metrics);
        }, "table gauges refreshed");
        expect(metrics).toMatch(/outbox_table_autovacuum_enabled 0/);
        expect(Number(/outbox_table_dead_tuples (\d+)/.exec(metrics)?.[1])).toBeGreaterThanOrEqual(200);
        expect(metrics).toMatch(/outbox_table_size_bytes \d+/);
      } finally {
        await service.stop();
      }
    } finally {
      await db.pool.query(`ALTER TABLE ${db.names.messages} RESET (autovacuum_enabled)`);
    }
  });

  it("shows the last vacuum once the table was vacuumed", async () => {
    await db.pool.query(`VACUUM ${db.names.messages}`);
    await until(async () => (await tableHealth(db.pool, db.schema))?.last_vacuum != null, "vacuum recorded");
    const health = await tableHealth(db.pool, db.schema);
    expect(health?.dead_tuples).toBeLessThan(200);
  });
});
