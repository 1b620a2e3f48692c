import type pg from "pg";
import { afterEach, beforeAll, beforeEach, describe, expect, it } from "vitest";
import {
  constant,
  followUp,
  handleInTransaction,
  type LeasePhase,
  OutboxError,
  transactionKysely,
} from "../../src/index.js";
import { testHandler } from "../../src/testing/harness.js";
import { testDatabase } from "../support/database.js";
import { publisherFor, until, workerFactory } from "../support/worker.js";

/**
 * Handlers that commit with their ack (issue 29, item 1): the handler's writes through
 * `message.transaction`, the token-fenced ack of its row and its follow-ups commit together or not at all.
 */

const db = testDatabase("txh");
const workers = workerFactory(db);
const outbox = publisherFor(db.schema);
const effects = `"${db.schema}".effects`;

beforeAll(async () => {
  await db.migrate();
  // No unique constraint: a duplicate effect would show as a second row.
  await db.pool.query(
    `CREATE TABLE ${effects} (seq bigserial, message_id bigint, key text, i int, owner text DEFAULT 'handler')`,
  );
});
beforeEach(async () => {
  await db.pool.query(`TRUNCATE ${db.names.messages}, ${db.names.deadLetters}, ${effects}`);
});

/** Releases whatever a failed test left open. */
let cleanup: (() => Promise<void>) | undefined;
afterEach(async () => {
  await cleanup?.();
  cleanup = undefined;
});

const n = async (sql: string, params: unknown[] = []) =>
  (await db.pool.query(sql, params)).rows[0].n as number;
const remaining = (queue: string) =>
  n(`SELECT count(*)::int AS n FROM ${db.names.messages} WHERE queue = $1`, [queue]);

function publish(queue: string, items: { payload: unknown; key?: string }[]): Promise<string[]> {
  return db.inTransaction((c) => outbox.publishMany(c, queue, items));
}

/** A promise and the function that resolves it. */
function gate() {
  let open!: () => void;
  const opened = new Promise<void>((resolve) => {
    open = resolve;
  });
  return { open, opened };
}

describe("handlers that commit with their ack", () => {
  it("pg form: each message's effect row commits with its ack; acked events as for batched acks", async () => {
    await publish(
      "pgform",
      Array.from({ length: 50 }, (_, i) => ({ payload: { i } })),
    );
    const worker = await workers.start({
      concurrency: 4,
      queues: {
        pgform: handleInTransaction<{ i: number }>(async (payload, message) => {
          await message.transaction.query(`INSERT INTO ${effects} (message_id, i) VALUES ($1, $2)`, [
            message.id,
            payload.i,
          ]);
        }),
      },
    });
    let acked = 0;
    worker.on("acked", () => acked++);
    await until(async () => (await remaining("pgform")) === 0, "the queue drains");
    await until(() => acked === 50, "50 acked events");
    expect(await n(`SELECT count(*)::int AS n FROM ${effects}`)).toBe(50);
    expect(await n(`SELECT count(DISTINCT message_id)::int AS n FROM ${effects}`)).toBe(50);
  });

  it("Kysely form: transactionKysely writes in the ack's transaction; its own transaction() is refused", async () => {
    await publish("kysely", [{ payload: { i: 1 } }, { payload: { i: 2 } }]);
    const refusals: Error[] = [];
    interface Db {
      effects: { message_id: string; i: number };
    }
    await workers.start({
      queues: {
        kysely: handleInTransaction<{ i: number }>(async (payload, message) => {
          const k = transactionKysely<Db>(message).withSchema(db.schema);
          await k.insertInto("effects").values({ message_id: message.id, i: payload.i }).execute();
          // Kysely's transaction() would COMMIT the ack's transaction early: refused, nothing sent.
          await k
            .transaction()
            .execute(async () => {})
            .catch((e: Error) => refusals.push(e));
        }),
      },
    });
    await until(async () => (await remaining("kysely")) === 0, "the queue drains");
    const { rows } = await db.pool.query(`SELECT i FROM ${effects} ORDER BY i`);
    expect(rows.map((r) => r.i)).toEqual([1, 2]);
    expect(refusals).toHaveLength(2);
    expect(refusals[0]?.message).toMatch(/already runs inside the transaction/);
    expect(refusals[0]).toBeInstanceOf(OutboxError);
  });

  it("a handler that throws rolls back its writes and the message is retried", async () => {
    await publish(
      "throws",
      Array.from({ length: 10 }, (_, i) => ({ payload: { i } })),
    );
    const worker = await workers.start({
      retry: constant(10),
      queues: {
        throws: handleInTransaction<{ i: number }>(async (payload, message) => {
          await message.transaction.query(`INSERT INTO ${effects} (message_id, i) VALUES ($1, $2)`, [
            message.id,
            payload.i,
          ]);
          if (message.attempts === 0) throw new Error("first attempt fails after its write");
        }),
      },
    });
    let retried = 0;
    worker.on("retried", () => retried++);
    await until(async () => (await remaining("throws")) === 0, "the queue drains");
    expect(retried).toBe(10);
    // One effect per message: the failed attempts' rows were rolled back.
    expect(await n(`SELECT count(*)::int AS n FROM ${effects}`)).toBe(10);
    expect(await n(`SELECT count(DISTINCT message_id)::int AS n FROM ${effects}`)).toBe(10);
  });

  it("a handler that times out mid-query: rolled back on a closed connection, then retried", async () => {
    const [id] = await publish("slow", [{ payload: {} }]);
    const sleeper = `pg_sleep(${30 + Math.floor(Math.random() * 1000)})`;
    cleanup = async () => {
      // The server notices the closed socket only after the sleep: end that session (its insert rolls back).
      await db.pool.query(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query LIKE $1 AND pid <> pg_backend_pid()",
        [`%${sleeper}%`],
      );
    };
    const worker = await workers.start({
      retry: constant(10),
      queues: {
        slow: handleInTransaction(
          async (_payload, message) => {
            await message.transaction.query(`INSERT INTO ${effects} (message_id, i) VALUES ($1, $2)`, [
              message.id,
              message.attempts,
            ]);
            // The first attempt is still running a query when its timeout fires.
            if (message.attempts === 0) await message.transaction.query(`SELECT ${sleeper}`);
          },
          { timeoutMs: 300 },
        ),
      },
    });
    const timedOut: string[] = [];
    worker.on("handler_timeout", (e) => timedOut.push(e.id));
    await until(async () => (await remaining("slow")) === 0, "the retry is acked", 60_000);
    expect(timedOut).toEqual([id]);
    const { rows } = await db.pool.query(`SELECT i FROM ${effects}`);
    expect(rows.map((r) => r.i)).toEqual([1]);
  });

  for (const form of ["keyless", "keyed follow-up", "keyed parent"] as const) {
    it(`follow-ups (${form}) commit with the handler's writes; a rolled back attempt publishes none`, async () => {
      await publish(
        "parent",
        Array.from({ length: 6 }, (_, i) => ({
          payload: { i },
          ...(form === "keyed parent" ? { key: `p${i % 2}` } : {}),
        })),
      );
      await workers.start({
        retry: constant(10),
        queues: {
          parent: handleInTransaction<{ i: number }>(async (payload, message) => {
            await message.transaction.query(`INSERT INTO ${effects} (message_id, i) VALUES ($1, $2)`, [
              message.id,
              payload.i,
            ]);
            const key = form === "keyed follow-up" ? { key: `f${payload.i % 3}` } : {};
            message.publish("child", { parent: message.id, form: "context" }, key);
            if (message.attempts === 0 && payload.i % 2 === 0) throw new Error("rolled back");
            return followUp("child", { parent: message.id, form: "returned" }, key);
          }),
        },
      });
      await until(async () => (await remaining("parent")) === 0, "the parents are acked");
      const { rows } = await db.pool.query(
        `SELECT payload ->> 'parent' AS parent, count(*)::int AS n FROM ${db.names.messages}
         WHERE queue = 'child' GROUP BY 1`,
      );
      expect(rows).toHaveLength(6);
      expect(rows.every((r) => r.n === 2)).toBe(true);
      expect(await n(`SELECT count(*)::int AS n FROM ${effects}`)).toBe(6);
    });
  }

  for (const keyed of [false, true]) {
    it(`token fence (${keyed ? "keyed" : "keyless"}): a handler whose lease was taken over commits nothing`, async () => {
      const [id] = await publish("fence", [{ payload: { i: 1 }, ...(keyed ? { key: "k" } : {}) }]);
      const atGate = gate();
      const release = gate();
      const worker = await workers.start({
        // No renewal in the test's window: the ack's token fence, not the heartbeat, finds the takeover.
        leaseTtlMs: 600_000,
        heartbeatMs: 300_000,
        queues: {
          fence: handleInTransaction(async (_payload, message) => {
            await message.transaction.query(`INSERT INTO ${effects} (message_id, i) VALUES ($1, 1)`, [
              message.id,
            ]);
            atGate.open();
            await release.opened;
          }),
        },
      });
      const lost: LeasePhase[] = [];
      worker.on("lease_lost", (e) => lost.push(e.phase));
      await atGate.opened;
      // Another worker's lease (as after an expiry): a new token on the row, and that owner's own effect.
      await db.pool.query(
        `UPDATE ${db.names.messages} SET acquired_token = gen_random_uuid(), acquired_by = 'newer',
           lease_expires_at = now() + interval '10 minutes' WHERE id = $1`,
        [id],
      );
      await db.pool.query(`INSERT INTO ${effects} (message_id, i, owner) VALUES ($1, 1, 'newer')`, [id]);
      release.open();
      await until(() => lost.length === 1, "the lease_lost event");
      expect(lost).toEqual(["ack"]);
      const { rows } = await db.pool.query(`SELECT owner FROM ${effects}`);
      expect(rows.map((r) => r.owner)).toEqual(["newer"]);
      // The newer owner's lease is intact.
      expect(
        await n(
          `SELECT count(*)::int AS n FROM ${db.names.messages} WHERE id = $1 AND acquired_by = 'newer'`,
          [id],
        ),
      ).toBe(1);
    });
  }

  it("keyed queue: per-key order holds, one handler per key at a time, each successor promoted after commit", async () => {
    const keys = ["a", "b", "c", "d"];
    await publish(
      "ordered",
      Array.from({ length: 80 }, (_, i) => ({ payload: { i }, key: keys[i % keys.length] as string })),
    );
    const running = new Map<string, number>();
    let maxPerKey = 0;
    await workers.start({
      concurrency: 8,
      queues: {
        ordered: handleInTransaction<{ i: number }>(async (payload, message) => {
          const k = message.key as string;
          running.set(k, (running.get(k) ?? 0) + 1);
          maxPerKey = Math.max(maxPerKey, running.get(k) ?? 0);
          try {
            await message.transaction.query(
              `INSERT INTO ${effects} (message_id, key, i) VALUES ($1, $2, $3)`,
              [message.id, k, payload.i],
            );
          } finally {
            running.set(k, (running.get(k) ?? 1) - 1);
          }
        }),
      },
    });
    await until(async () => (await remaining("ordered")) === 0, "the queue drains", 120_000);
    expect(maxPerKey).toBe(1);
    for (const k of keys) {
      const { rows } = await db.pool.query(`SELECT i FROM ${effects} WHERE key = $1 ORDER BY seq`, [k]);
      const seen = rows.map((r) => r.i as number);
      expect(seen).toEqual([...seen].sort((x, y) => x - y));
      expect(seen).toHaveLength(20);
    }
  });

  it("a busy key lock (a producer's open transaction on the key) is waited for in the transaction, not lost", async () => {
    const [head] = await publish("busy", [{ payload: { i: 1 }, key: "k" }]);
    // A producer publishing to the same key holds its lock until it commits.
    const producer: pg.PoolClient = await db.pool.connect();
    await producer.query("BEGIN");
    let ended = false;
    const end = async (sql: string) => {
      if (ended) return;
      ended = true;
      await producer.query(sql);
      producer.release();
    };
    cleanup = () => end("ROLLBACK");
    await outbox.publish(producer, "busy", { i: 2 }, { key: "k" });
    const appName = `tx-busy-${Date.now()}`;
    const worker = await workers.start({
      workerId: appName,
      queues: {
        busy: handleInTransaction<{ i: number }>(async (payload, message) => {
          await message.transaction.query(
            `INSERT INTO ${effects} (message_id, key, i) VALUES ($1, 'k', $2)`,
            [message.id, payload.i],
          );
        }),
      },
    });
    // The head's handler ran; its ack found the key busy and waits, inside its open transaction.
    await until(
      async () =>
        (await n(
          `SELECT count(*)::int AS n FROM pg_stat_activity
           WHERE application_name LIKE '%' || $1 || '%' AND state = 'idle in transaction' AND query LIKE '%ack_key%'`,
          [appName],
        )) >= 1,
      "the ack waits for the producer's key lock",
      60_000,
    );
    const lost: string[] = [];
    worker.on("lease_lost", (e) => lost.push(e.id));
    expect(await n(`SELECT count(*)::int AS n FROM ${effects}`)).toBe(0);
    expect(await n(`SELECT count(*)::int AS n FROM ${db.names.messages} WHERE id = $1`, [head])).toBe(1);
    await end("COMMIT");
    await until(async () => (await remaining("busy")) === 0, "both messages are handled", 60_000);
    const { rows } = await db.pool.query(`SELECT i FROM ${effects} ORDER BY seq`);
    expect(rows.map((r) => r.i)).toEqual([1, 2]);
    // Waited for, never given up as lost (which would leave the row to its lease's expiry).
    expect(lost).toEqual([]);
  });

  it("refuses a transactional queue where no database runs it: the test harness", () => {
    expect(() => testHandler(handleInTransaction(async () => {}))).toThrow(
      /queues\.test\.transaction: the test harness runs no database/,
    );
  });

  it("refuses message.transaction once the handler has returned", async () => {
    await publish("late", [{ payload: {} }]);
    let late: Promise<unknown> | undefined;
    const afterAck = gate();
    await workers.start({
      queues: {
        late: handleInTransaction(async (_payload, message) => {
          const tx = message.transaction;
          // A fire-and-forget task of the handler that queries after it returned.
          late = afterAck.opened.then(() => tx.query("SELECT 1"));
        }),
      },
    });
    await until(async () => (await remaining("late")) === 0, "the message is acked");
    afterAck.open();
    await until(() => late !== undefined, "the handler ran");
    await expect(late).rejects.toThrow(/used after the handler returned/);
    await expect(late).rejects.toBeInstanceOf(OutboxError);
  });
});
