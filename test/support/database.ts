import { randomBytes } from "node:crypto";
import pg from "pg";
import { afterAll, inject } from "vitest";
import { migrate } from "../../src/migrate/migrator.js";
import { outboxNames } from "../../src/sql/names.js";

/**
 * Each test file gets its own outbox schema in the shared test database, so files run in parallel without
 * seeing each other's rows or notifications (the wake-up channel is derived from the schema).
 */
export function testDatabase(prefix = "t") {
  const url = inject("databaseUrl");
  const schema = `${prefix}_${randomBytes(5).toString("hex")}`;
  const names = outboxNames(schema);
  const pool = new pg.Pool({ connectionString: url, max: 10 });
  const extraSchemas: string[] = [];

  afterAll(async () => {
    for (const s of [schema, ...extraSchemas]) {
      await pool.query(`DROP SCHEMA IF EXISTS "${s}" CASCADE`);
    }
    await pool.end();
  });

  return {
    url,
    schema,
    names,
    pool,
    migrate: () => migrate({ connection: pool, schema }),
    /** Another schema name that is dropped with this file's. */
    freshSchema(tag = "x"): string {
      const s = `${prefix}_${tag}_${randomBytes(5).toString("hex")}`;
      extraSchemas.push(s);
      return s;
    },
    /** Run fn inside a transaction on one client; commit unless it throws (or `rollback` is set). */
    async inTransaction<T>(fn: (client: pg.PoolClient) => Promise<T>, rollback = false): Promise<T> {
      const client = await pool.connect();
      try {
        await client.query("BEGIN");
        const result = await fn(client);
        await client.query(rollback ? "ROLLBACK" : "COMMIT");
        return result;
      } catch (error) {
        await client.query("ROLLBACK").catch(() => {});
        throw error;
      } finally {
        client.release();
      }
    },
  };
}

/** A LISTEN connection that collects notifications of one channel. */
export async function listen(url: string, channel: string) {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  const received: string[] = [];
  const waiters: (() => void)[] = [];
  client.on("notification", (n) => {
    if (n.channel !== channel) return;
    received.push(n.payload ?? "");
    for (const w of waiters.splice(0)) w();
  });
  await client.query(`LISTEN "${channel}"`);
  return {
    received,
    /** Resolves once `count` notifications have arrived, or rejects after `timeoutMs`. */
    async waitFor(count: number, timeoutMs = 5000): Promise<string[]> {
      const deadline = Date.now() + timeoutMs;
      while (received.length < count) {
        const left = deadline - Date.now();
        if (left <= 0)
          throw new Error(`expected ${count} notifications on ${channel}, got ${received.length}`);
        await new Promise<void>((resolve) => {
          const timer = setTimeout(resolve, left);
          waiters.push(() => {
            clearTimeout(timer);
            resolve();
          });
        });
      }
      return received;
    },
    /** Give the server a round trip to deliver anything pending, then report what arrived. */
    async settle(): Promise<string[]> {
      await client.query("SELECT 1");
      return received;
    },
    close: () => client.end(),
  };
}
