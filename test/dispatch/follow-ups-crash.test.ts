import { spawn } from "node:child_process";
import path from "node:path";
import type pg from "pg";
import { afterEach, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { followUp } from "../../src/index.js";
import { testDatabase } from "../support/database.js";
import { publisherFor, until, workerFactory } from "../support/worker.js";

/**
 * A worker killed between its handler and its ack (DESIGN §4.2 with follow-ups): the child's handler has
 * returned, and its ack statement waits for a lock on the messages table the test holds. Whether the
 * in-flight ack is then rolled back (its session terminated) or still commits (the server finishes a dead
 * client's statement), each follow-up exists exactly once in the end.
 */

const db = testDatabase("fupc");
const workers = workerFactory(db);
const outbox = publisherFor(db.schema);

beforeAll(async () => {
  await db.migrate();
  await db.pool.query(`CREATE TABLE "${db.schema}".ledger (id bigint, worker text)`);
});
beforeEach(async () => {
  await db.pool.query(`TRUNCATE ${db.names.messages}, ${db.names.deadLetters}, "${db.schema}".ledger`);
});

const n = async (sql: string, params: unknown[] = []) =>
  (await db.pool.query(sql, params)).rows[0].n as number;

/** Releases a lock a failed test left held. */
let releaseHeld: (() => Promise<void>) | undefined;
afterEach(async () => {
  await releaseHeld?.();
});

/** An open transaction holding `lock` until `release` (at most once; afterEach releases a forgotten one). */
async function hold(lock: string): Promise<{ release: () => Promise<void> }> {
  const client: pg.PoolClient = await db.pool.connect();
  await client.query("BEGIN");
  await client.query(lock);
  let released: Promise<void> | undefined;
  const release = () => {
    released ??= client.query("ROLLBACK").then(() => client.release());
    return released;
  };
  const previous = releaseHeld;
  releaseHeld = async () => {
    await previous?.();
    await release();
  };
  return { release };
}

function startChild(workerId: string) {
  // node itself, with tsx as a loader: the tsx CLI would run the worker in a grandchild that SIGKILL misses.
  const child = spawn(
    process.execPath,
    ["--import", "tsx", path.resolve("test/support/fixtures/follow-ups-child.ts")],
    {
      env: {
        ...process.env,
        DATABASE_URL: db.url,
        OUTBOX_SCHEMA: db.schema,
        WORKER_ID: workerId,
        PGAPPNAME: `fup-ledger ${workerId}`,
      },
      stdio: ["ignore", "pipe", "inherit"],
    },
  );
  const exited = new Promise((resolve) => child.once("exit", resolve));
  return { child, exited };
}

const childSessions = (workerId: string, where = "true") =>
  n(
    `SELECT count(*)::int AS n FROM pg_stat_activity WHERE application_name LIKE '%' || $1 || '%' AND ${where}`,
    [workerId],
  );

describe("a worker killed between handler and ack", () => {
  for (const parentKey of [null, "p"] as const) {
    for (const ackFate of ["rolled back", "committed by the server"] as const) {
      it(`${parentKey ? "keyed" : "keyless"} parent, in-flight ack ${ackFate}: each follow-up exists once`, async () => {
        // The child's handler waits at a gate (this advisory lock) after writing its ledger row; meanwhile the
        // test locks the messages table against writes, then opens the gate: the ack that follows waits.
        const gate = await hold("SELECT pg_advisory_xact_lock(4242)");
        const workerId = `fup-child-${Date.now()}`;
        const [id] = await db.inTransaction((c) =>
          outbox.publishMany(c, "parent", [{ payload: {}, ...(parentKey ? { key: parentKey } : {}) }]),
        );
        const { child, exited } = startChild(workerId);
        let table: { release: () => Promise<void> } | undefined;
        try {
          await until(
            async () =>
              (await childSessions(workerId, "wait_event_type = 'Lock' AND wait_event = 'advisory'")) === 1,
            // The child is node with a TypeScript loader: its start takes a while on a busy machine.
            "the child's handler ran and waits at the gate",
            120_000,
          );
          table = await hold(`LOCK TABLE ${db.names.messages} IN SHARE MODE`);
          await gate.release();
          await until(
            async () =>
              (await childSessions(
                workerId,
                "wait_event_type = 'Lock' AND wait_event = 'relation' AND (query LIKE '%DELETE%' OR query LIKE '%ack_key%')",
              )) === 1,
            "the child's handler returned and its ack waits for the table lock",
            120_000,
          );
          expect(await n(`SELECT count(*)::int AS n FROM "${db.schema}".ledger`)).toBe(1);
        } finally {
          child.kill("SIGKILL");
        }
        await exited;
        if (ackFate === "rolled back") {
          // The worker's process is gone; ending its session rolls back the statement it left in flight.
          await db.pool.query(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name LIKE '%' || $1 || '%'",
            [workerId],
          );
        }
        await table?.release();
        // Once none of the child's sessions is left, nothing of it can write any more.
        await until(async () => (await childSessions(workerId)) === 0, "the child's sessions have ended");
        const parentLeft = await n(`SELECT count(*)::int AS n FROM ${db.names.messages} WHERE id = $1`, [id]);
        const afterNow = await n(`SELECT count(*)::int AS n FROM ${db.names.messages} WHERE queue = 'after'`);
        // Atomic: either the ack and both follow-ups, or neither. Keyed or not, the ack with its follow-ups
        // is one statement, which the server finishes for a dead client unless its session is ended.
        const committed = ackFate !== "rolled back";
        expect([parentLeft, afterNow]).toEqual(committed ? [0, 2] : [1, 0]);

        // The dead worker's lease runs out now instead of after its TTL; a survivor redelivers the parent.
        await db.pool.query(
          `UPDATE ${db.names.messages} SET lease_expires_at = now() - interval '1 second' WHERE acquired_token IS NOT NULL`,
        );
        await workers.start({
          queues: {
            parent: async (_p, message) => {
              await db.pool.query(`INSERT INTO "${db.schema}".ledger (id, worker) VALUES ($1, 'survivor')`, [
                message.id,
              ]);
              message.publish("after", { parent: message.id, form: "context" });
              return followUp(
                "after",
                { parent: message.id, form: "returned" },
                message.key ? { key: "held" } : {},
              );
            },
          },
        });
        await until(
          async () =>
            (await n(`SELECT count(*)::int AS n FROM ${db.names.messages} WHERE queue = 'parent'`)) === 0,
          "the parent is acknowledged",
        );
        const { rows } = await db.pool.query(
          `SELECT payload FROM ${db.names.messages} WHERE queue = 'after' ORDER BY id`,
        );
        expect(rows.map((r) => r.payload)).toEqual([
          { parent: id, form: "context" },
          { parent: id, form: "returned" },
        ]);
        const runs = await n(`SELECT count(*)::int AS n FROM "${db.schema}".ledger`);
        expect(runs).toBe(committed ? 1 : 2);
      }, 420_000);
    }
  }

  it("killed mid-batch with many parents: after the survivor's drain each parent has exactly one follow-up", async () => {
    const ids = await db.inTransaction((c) =>
      outbox.publishMany(
        c,
        "bulk",
        Array.from({ length: 300 }, (_, i) => ({ payload: { i } })),
      ),
    );
    const workerId = `fup-bulk-${Date.now()}`;
    const { child, exited } = startChild(workerId);
    try {
      await until(
        async () => (await n(`SELECT count(*)::int AS n FROM "${db.schema}".ledger`)) >= 60,
        "the child is handling parents",
        120_000,
      );
    } finally {
      child.kill("SIGKILL");
    }
    await exited;
    await until(async () => (await childSessions(workerId)) === 0, "the child's sessions have ended");
    const heldByDead = await n(`SELECT count(*)::int AS n FROM ${db.names.messages} WHERE acquired_by = $1`, [
      workerId,
    ]);
    expect(heldByDead).toBeGreaterThan(0);
    await db.pool.query(
      `UPDATE ${db.names.messages} SET lease_expires_at = now() - interval '1 second' WHERE acquired_by = $1`,
      [workerId],
    );
    await workers.start({
      queues: { bulk: (_p, message) => followUp("bulk-next", { parent: message.id }) },
    });
    await until(
      async () => (await n(`SELECT count(*)::int AS n FROM ${db.names.messages} WHERE queue = 'bulk'`)) === 0,
      "the survivor drains every parent",
      120_000,
    );
    const { rows } = await db.pool.query(
      `SELECT payload ->> 'parent' AS parent, count(*)::int AS n FROM ${db.names.messages}
       WHERE queue = 'bulk-next' GROUP BY 1`,
    );
    const perParent = new Map(rows.map((r) => [r.parent as string, r.n as number]));
    expect(ids.filter((id) => perParent.get(id) !== 1)).toEqual([]);
    expect(perParent.size).toBe(300);
  }, 420_000);
});
