import { Kysely, PostgresDialect, sql } from "kysely";
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { z } from "zod";
import { OutboxConfigError, OutboxPayloadError } from "../../src/contract/errors.js";
import { enableNotifyTrigger } from "../../src/migrate/notify-trigger.js";
import { createPublisher } from "../../src/produce/publisher.js";
import { defineQueue } from "../../src/produce/queue.js";
import { listen, testDatabase } from "../support/database.js";

const db = testDatabase("pub");
// Kysely owns (and on destroy ends) its own pool.
const kysely = new Kysely<Record<string, never>>({
  dialect: new PostgresDialect({ pool: new pg.Pool({ connectionString: db.url, max: 4 }) }),
});

const orderCreated = defineQueue(
  "order.created",
  z.object({ orderId: z.number().int().positive(), total: z.string(), note: z.string().optional() }),
);

interface MessageRow {
  id: string;
  queue: string;
  payload: unknown;
  headers: Record<string, string>;
  key: string | null;
  available_at: Date;
  created_at: Date;
  acquired_token: string | null;
  deliveries_count: number;
}

async function rows(where = "true"): Promise<MessageRow[]> {
  return (await db.pool.query(`SELECT * FROM ${db.names.messages} WHERE ${where} ORDER BY id`)).rows;
}

beforeAll(async () => {
  await db.migrate();
  await db.pool.query(`CREATE TABLE "${db.schema}".orders (id int PRIMARY KEY, total numeric NOT NULL)`);
});
afterAll(() => kysely.destroy());

describe("publish with pg", () => {
  // cooldownMs 0: every publish notifies, so each test sees its own notification.
  const outbox = createPublisher({ schema: db.schema, notify: { cooldownMs: 0 } });

  it("commits the row with the business row and notifies at commit, not before", async () => {
    const listener = await listen(db.url, db.names.channel);
    try {
      const id = await db.inTransaction(async (client) => {
        await client.query(`INSERT INTO "${db.schema}".orders VALUES (1, 10)`);
        const id = await outbox.publish(client, orderCreated, { orderId: 1, total: "10.00" });
        // Not visible (and not announced) outside the transaction until it commits.
        expect(await rows(`id = ${id}`)).toEqual([]);
        expect(await listener.settle()).toEqual([]);
        return id;
      });
      expect(id).toMatch(/^\d+$/);
      const [row] = await rows(`id = ${id}`);
      expect(row).toMatchObject({
        queue: "order.created",
        payload: { orderId: 1, total: "10.00" },
        headers: {},
        key: null,
        acquired_token: null,
        deliveries_count: 0,
      });
      expect(await listener.waitFor(1)).toEqual(["order.created"]);
    } finally {
      await listener.close();
    }
  });

  it("a rolled-back transaction leaves no row and no notification", async () => {
    const listener = await listen(db.url, db.names.channel);
    try {
      const before = (await rows()).length;
      let id = "";
      await db.inTransaction(async (client) => {
        await client.query(`INSERT INTO "${db.schema}".orders VALUES (2, 20)`);
        id = await outbox.publish(client, orderCreated, { orderId: 2, total: "20.00" });
      }, true);
      expect(await rows(`id = ${id}`)).toEqual([]);
      expect((await rows()).length).toBe(before);
      expect((await db.pool.query(`SELECT * FROM "${db.schema}".orders WHERE id = 2`)).rows).toEqual([]);
      expect(await listener.settle()).toEqual([]);
    } finally {
      await listener.close();
    }
  });

  it("stores key, headers and a delay computed on the server clock", async () => {
    const { id, serverNow } = await db.inTransaction(async (client) => {
      const id = await outbox.publish(
        client,
        orderCreated,
        { orderId: 3, total: "1" },
        { key: "customer-7", delayMs: 60_000, headers: { traceparent: "00-abc-def-01" } },
      );
      const serverNow = (await client.query("SELECT now() AS t")).rows[0].t as Date;
      return { id, serverNow };
    });
    const [row] = await rows(`id = ${id}`);
    expect(row?.key).toBe("customer-7");
    expect(row?.headers).toEqual({ traceparent: "00-abc-def-01" });
    expect(row?.available_at.getTime()).toBe(serverNow.getTime() + 60_000);
  });

  it("honours availableAt", async () => {
    const at = new Date("2030-01-02T03:04:05.678Z");
    const id = await db.inTransaction((c) =>
      outbox.publish(c, "plain", { any: ["json"] }, { availableAt: at }),
    );
    expect((await rows(`id = ${id}`))[0]?.available_at.toISOString()).toBe(at.toISOString());
  });

  it("stores what the schema outputs (defaults, stripped keys)", async () => {
    const q = defineQueue("with.defaults", z.object({ n: z.number(), level: z.string().default("info") }));
    const id = await db.inTransaction((c) => outbox.publish(c, q, { n: 1, extra: true } as { n: number }));
    expect((await rows(`id = ${id}`))[0]?.payload).toEqual({ n: 1, level: "info" });
  });

  it("batch-publishes many rows in one statement, ids in input order", async () => {
    const listener = await listen(db.url, db.names.channel);
    try {
      const items = Array.from({ length: 250 }, (_, i) => ({
        payload: { orderId: i + 1, total: String(i) },
        key: i % 2 ? `k${i % 5}` : undefined,
        headers: { n: String(i) },
        delayMs: i === 0 ? 5_000 : undefined,
      }));
      const ids = await db.inTransaction((c) => outbox.publishMany(c, orderCreated, items));
      expect(ids).toHaveLength(250);
      const stored = await rows(`id = ANY('{${ids.join(",")}}'::bigint[])`);
      expect(stored.map((r) => r.id)).toEqual(ids);
      stored.forEach((r, i) => {
        expect(r.payload).toEqual(items[i]?.payload);
        expect(r.headers).toEqual({ n: String(i) });
        expect(r.key).toBe(items[i]?.key ?? null);
      });
      expect(stored[0]?.available_at.getTime()).toBeGreaterThan(stored[1]?.available_at.getTime() ?? 0);
      // One notification for the whole batch.
      expect(await listener.waitFor(1)).toEqual(["order.created"]);
      expect(await listener.settle()).toHaveLength(1);
      expect(await db.inTransaction((c) => outbox.publishMany(c, orderCreated, []))).toEqual([]);
    } finally {
      await listener.close();
    }
  });
});

describe("publish with Kysely", () => {
  const outbox = createPublisher({ schema: db.schema, notify: { cooldownMs: 0 } });

  it("commits with the transaction and notifies", async () => {
    const listener = await listen(db.url, db.names.channel);
    try {
      const id = await kysely.transaction().execute(async (trx) => {
        await sql`INSERT INTO ${sql.table(`${db.schema}.orders`)} VALUES (100, 5)`.execute(trx);
        return outbox.publish(trx, orderCreated, { orderId: 100, total: "5" }, { key: "c1" });
      });
      expect((await rows(`id = ${id}`))[0]).toMatchObject({
        payload: { orderId: 100, total: "5" },
        key: "c1",
      });
      expect(await listener.waitFor(1)).toEqual(["order.created"]);
      const ids = await kysely
        .transaction()
        .execute((trx) => outbox.publishMany(trx, orderCreated, [{ payload: { orderId: 101, total: "1" } }]));
      expect(ids).toHaveLength(1);
    } finally {
      await listener.close();
    }
  });

  it("rolls back with the transaction: no row, no notification", async () => {
    const listener = await listen(db.url, db.names.channel);
    try {
      let id = "";
      await expect(
        kysely.transaction().execute(async (trx) => {
          id = await outbox.publish(trx, orderCreated, { orderId: 102, total: "5" });
          throw new Error("business rule failed");
        }),
      ).rejects.toThrow("business rule failed");
      expect(id).not.toBe("");
      expect(await rows(`id = ${id}`)).toEqual([]);
      expect(await listener.settle()).toEqual([]);
    } finally {
      await listener.close();
    }
  });
});

describe("refusals happen before anything is written", () => {
  const outbox = createPublisher({ schema: db.schema, maxPayloadBytes: 200, notify: false });

  async function expectNothingWritten(attempt: () => Promise<unknown>, message: RegExp) {
    const before = (await rows()).length;
    await expect(attempt()).rejects.toThrow(message);
    expect((await rows()).length).toBe(before);
  }

  it("names the queue and the field of an invalid payload", async () => {
    await expectNothingWritten(
      () => db.inTransaction((c) => outbox.publish(c, orderCreated, { orderId: -1, total: 5 } as never)),
      /queue "order\.created": invalid payload: orderId: .*; total: /,
    );
    await expect(
      db.inTransaction((c) => outbox.publish(c, orderCreated, { orderId: -1, total: "5" })),
    ).rejects.toBeInstanceOf(OutboxPayloadError);
  });

  it("refuses an oversized payload with its size and the limit", async () => {
    await expectNothingWritten(
      () => db.inTransaction((c) => outbox.publish(c, "big", { blob: "x".repeat(500) })),
      /queue "big": payload is 511 bytes, over the maximum of 200 bytes/,
    );
  });

  it("refuses one bad item of a batch and writes none of it", async () => {
    await expectNothingWritten(
      () =>
        db.inTransaction((c) =>
          outbox.publishMany(c, orderCreated, [
            { payload: { orderId: 1, total: "1" } },
            { payload: { orderId: 0, total: "1" } },
          ]),
        ),
      /invalid payload: orderId/,
    );
  });

  it("refuses values JSON cannot carry, and bad options", async () => {
    await expectNothingWritten(
      () => db.inTransaction((c) => outbox.publish(c, "q", { n: 1n })),
      /not JSON-serialisable/,
    );
    await expectNothingWritten(
      () => db.inTransaction((c) => outbox.publish(c, "q", {}, { delayMs: 5, availableAt: new Date() })),
      /availableAt: give delayMs or availableAt, not both/,
    );
    await expectNothingWritten(
      () => db.inTransaction((c) => outbox.publish(c, "q", {}, { headers: { n: 1 as unknown as string } })),
      /invalid options: headers\.n/,
    );
    await expect(db.inTransaction((c) => outbox.publish(c, "bad queue", {}))).rejects.toThrow(
      OutboxConfigError,
    );
  });

  it("rejects a bad publisher config by field", () => {
    expect(() => createPublisher({ schema: "Bad-Schema" })).toThrow(/schema: .*plain identifier/);
    expect(() => createPublisher({ maxPayloadBytes: -1 })).toThrow(/maxPayloadBytes/);
    expect(() => createPublisher({ notify: { cooldownMs: -5 } })).toThrow(/notify\.cooldownMs/);
  });
});

describe("wake-up notifications", () => {
  it("notifies once per cooldown window in-transaction and sends one trailing notification", async () => {
    const listener = await listen(db.url, db.names.channel);
    try {
      const outbox = createPublisher({ schema: db.schema, notify: { cooldownMs: 300, connection: db.pool } });
      const q = defineQueue("throttled");
      const started = Date.now();
      for (let i = 0; i < 10; i++) await db.inTransaction((c) => outbox.publish(c, q, { i }));
      // The 10 publishes took well under the window only if the database is fast; the assertion below
      // holds either way: never more than one notification per window per queue.
      const windows = Math.floor((Date.now() - started) / 300) + 1;
      await listener.waitFor(2, 30_000);
      const got = await listener.settle();
      expect(got.every((q) => q === "throttled")).toBe(true);
      expect(got.length).toBeLessThanOrEqual(windows + 1);
      expect(got.length).toBeGreaterThanOrEqual(2);
    } finally {
      await listener.close();
    }
  });

  it("with notify off, publishes are silent (the worker's poll finds them)", async () => {
    const listener = await listen(db.url, db.names.channel);
    try {
      const outbox = createPublisher({ schema: db.schema, notify: false });
      await db.inTransaction((c) => outbox.publish(c, "quiet", {}));
      expect(await listener.settle()).toEqual([]);
    } finally {
      await listener.close();
    }
  });

  it("plain SQL inserts notify only when the optional trigger is enabled", async () => {
    const schema = db.freshSchema("trg");
    const { migrate } = await import("../../src/migrate/migrator.js");
    const { outboxNames } = await import("../../src/sql/names.js");
    await migrate({ connection: db.pool, schema });
    const names = outboxNames(schema);
    const listener = await listen(db.url, names.channel);
    try {
      await db.pool.query(`INSERT INTO ${names.messages} (queue, payload) VALUES ('sql.q', '{}')`);
      expect(await listener.settle()).toEqual([]);
      await enableNotifyTrigger(db.pool, schema);
      await enableNotifyTrigger(db.pool, schema); // idempotent
      await db.pool.query(
        `INSERT INTO ${names.messages} (queue, payload) VALUES ('sql.a', '{}'), ('sql.a', '{}'), ('sql.b', '{}')`,
      );
      await listener.waitFor(2);
      expect((await listener.settle()).sort()).toEqual(["sql.a", "sql.b"]);
    } finally {
      await listener.close();
    }
  });
});
