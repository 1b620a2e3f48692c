import { spawn } from "node:child_process";
import path from "node:path";
import { beforeAll, describe, expect, it } from "vitest";
import { testDatabase } from "../support/database.js";
import { publisherFor, until } from "../support/worker.js";

/**
 * Issue 29's first must-hold: a transactional handler killed (SIGKILL) between its write and its ack leaves
 * both or neither. A child worker drains 1,000 messages, writing one effect row per message into a table
 * without a unique constraint, and kills itself after the write of the first delivery of every 40th
 * message; the test restarts it until the queue is empty. Exactly 1,000 effect rows, one per message.
 */

const db = testDatabase("txc");
const outbox = publisherFor(db.schema);
const TOTAL = 1000;

beforeAll(async () => {
  await db.migrate();
  await db.pool.query(`CREATE TABLE "${db.schema}".effects (message_id bigint, i int)`);
});

const n = async (sql: string, params: unknown[] = []) =>
  (await db.pool.query(sql, params)).rows[0].n as number;

function startChild(workerId: string) {
  // node itself, with tsx as a loader: the tsx CLI would run the worker in a grandchild that SIGKILL misses.
  const child = spawn(
    process.execPath,
    ["--import", "tsx", path.resolve("test/support/fixtures/tx-crash-worker.ts")],
    {
      env: { ...process.env, DATABASE_URL: db.url, OUTBOX_SCHEMA: db.schema, WORKER_ID: workerId },
      stdio: ["ignore", "ignore", "inherit"],
    },
  );
  const exited = new Promise<NodeJS.Signals | null>((resolve) => child.once("exit", (_c, s) => resolve(s)));
  return { child, exited };
}

const sessionsOf = (workerId: string) =>
  n(`SELECT count(*)::int AS n FROM pg_stat_activity WHERE application_name LIKE '%' || $1 || '%'`, [
    workerId,
  ]);

describe("a transactional handler killed between its write and its ack", () => {
  it("1,000 messages, killed again and again: exactly 1,000 effect rows, one per message", async () => {
    await db.inTransaction((c) =>
      outbox.publishMany(
        c,
        "crash",
        Array.from({ length: TOTAL }, (_, i) => ({ payload: { i } })),
      ),
    );
    const remaining = () => n(`SELECT count(*)::int AS n FROM ${db.names.messages}`);
    let kills = 0;
    for (let run = 0; (await remaining()) > 0; run++) {
      expect(run).toBeLessThan(200);
      const workerId = `txc-${run}-${Date.now()}`;
      const { child, exited } = startChild(workerId);
      // Either it kills itself (a message whose first delivery it is), or it drains what is left.
      const ended = await Promise.race([
        exited,
        until(async () => (await remaining()) === 0, "the queue drains", 600_000).then(() => "drained"),
      ]);
      if (ended === "drained") {
        child.kill("SIGTERM");
        await exited;
        break;
      }
      expect(ended).toBe("SIGKILL");
      kills++;
      // Once none of its sessions is left, nothing of the dead child can write any more.
      await until(async () => (await sessionsOf(workerId)) === 0, "the child's sessions have ended", 60_000);
      // Its leases run out now instead of after their TTL (DESIGN §7: back-dated, not slept through).
      await db.pool.query(
        `UPDATE ${db.names.messages} SET lease_expires_at = now() - interval '1 second' WHERE acquired_by = $1`,
        [workerId],
      );
    }
    expect(kills).toBeGreaterThanOrEqual(TOTAL / 40 - 1);
    expect(await n(`SELECT count(*)::int AS n FROM ${db.names.deadLetters}`)).toBe(0);
    expect(await n(`SELECT count(*)::int AS n FROM "${db.schema}".effects`)).toBe(TOTAL);
    expect(await n(`SELECT count(DISTINCT message_id)::int AS n FROM "${db.schema}".effects`)).toBe(TOTAL);
  }, 1_200_000);
});
