import { spawn } from "node:child_process";
import path from "node:path";
import { beforeAll, beforeEach, describe, expect, it } from "vitest";
import { PermanentError } from "../../src/index.js";
import { subscribe } from "../../src/subscribe/subscriptions.js";
import { testDatabase } from "../support/database.js";
import { publisherFor, until, workerFactory } from "../support/worker.js";

/**
 * Issue 29's fifth "must hold": a dead-letter move with failure announcement, killed at random points, leaves
 * the failure event if and only if the dead letter exists, exactly once each. A worker child process
 * dead-letters 300 messages (keyed and keyless) and is SIGKILLed again and again until all are dead.
 *
 * The window is widened on purpose: a test-only trigger sleeps inside the move for some dead letters, and
 * half the kills land while the child's move sleeps there (seen in pg_stat_activity). The server then either
 * finishes that statement for its dead client (it commits) or the test ends the session (it rolls back). An
 * implementation announcing in a later statement or transaction would leave a dead letter with no event
 * after the first kind; the other kills land at a random moment.
 */

const db = testDatabase("fanc");
const workers = workerFactory(db);
const outbox = publisherFor(db.schema);

beforeAll(async () => {
  await db.migrate();
  await db.pool.query(`
    CREATE FUNCTION "${db.schema}".slow_dead() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      IF NEW.id % 9 = 0 THEN PERFORM pg_sleep(0.3); END IF;
      RETURN NEW;
    END $$;
    CREATE TRIGGER slow_dead AFTER INSERT ON ${db.names.deadLetters}
      FOR EACH ROW EXECUTE FUNCTION "${db.schema}".slow_dead()`);
});
beforeEach(async () => {
  await db.pool.query(`TRUNCATE ${db.names.messages}, ${db.names.deadLetters}, ${db.names.subscriptions}`);
});

const n = async (sql: string, params: unknown[] = []) =>
  (await db.pool.query(sql, params)).rows[0].n as number;

function startChild(workerId: string, announceTo: "queue" | "topic") {
  // node itself, with tsx as a loader: the tsx CLI would run the worker in a grandchild that SIGKILL misses.
  const child = spawn(
    process.execPath,
    ["--import", "tsx", path.resolve("test/support/fixtures/announce-worker.ts")],
    {
      env: {
        ...process.env,
        DATABASE_URL: db.url,
        OUTBOX_SCHEMA: db.schema,
        WORKER_ID: workerId,
        ANNOUNCE_TO: announceTo,
        PGAPPNAME: `announce ${workerId}`,
      },
      stdio: ["ignore", "pipe", "inherit"],
    },
  );
  const exited = new Promise((resolve) => child.once("exit", resolve));
  const ready = new Promise<void>((resolve) => child.stdout.once("data", () => resolve()));
  return { child, exited, ready };
}

const childSessions = (workerId: string, where = "true") =>
  n(
    `SELECT count(*)::int AS n FROM pg_stat_activity WHERE application_name LIKE '%' || $1 || '%' AND ${where}`,
    [workerId],
  );

/** Kill rounds until a few are done, then a worker in this process drains what is left. */
async function killAndRestart(announceTo: "queue" | "topic", rounds: number): Promise<{ hooked: number }> {
  let hooked = 0;
  for (let round = 0; round < rounds; round++) {
    if ((await n(`SELECT count(*)::int AS n FROM ${db.names.messages} WHERE queue = 'doomed'`)) === 0) break;
    const workerId = `ann-${round}-${Date.now()}`;
    const { child, exited, ready } = startChild(workerId, announceTo);
    try {
      await Promise.race([ready, exited]);
      if (round % 2 === 0) {
        // On the hook: the child's move sleeps inside the trigger, before its statement commits.
        await until(
          async () => (await childSessions(workerId, "wait_event = 'PgSleep'")) > 0,
          "the child's dead-letter move sleeps in the trigger",
          120_000,
        );
        hooked++;
      } else {
        await new Promise((resolve) => setTimeout(resolve, Math.floor(Math.random() * 400)));
      }
    } finally {
      child.kill("SIGKILL");
    }
    await exited;
    if (round % 4 === 2) {
      // Ending the dead client's sessions rolls back the statement it left in flight.
      await db.pool.query(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name LIKE '%' || $1 || '%'",
        [workerId],
      );
    }
    // Otherwise the server finishes (and commits) it. Once no session is left, nothing of it writes any more.
    await until(async () => (await childSessions(workerId)) === 0, "the child's sessions have ended", 60_000);
    // Its leases run out now instead of after their TTL.
    await db.pool.query(
      `UPDATE ${db.names.messages} SET lease_expires_at = now() - interval '1 second' WHERE acquired_by = $1`,
      [workerId],
    );
  }
  await workers.start({
    queues: {
      doomed: {
        handler: () => {
          throw new PermanentError("doomed");
        },
        announceFailures: announceTo === "topic" ? { topic: "doomed.failed" } : { queue: "failures" },
      },
    },
  });
  await until(
    async () => (await n(`SELECT count(*)::int AS n FROM ${db.names.messages} WHERE queue = 'doomed'`)) === 0,
    "every message dead",
    240_000,
  );
  return { hooked };
}

/** Each dead letter's events per target queue: `{ [id]: count }` for each queue. */
async function eventsPerDeadLetter(queue: string): Promise<Map<string, number>> {
  const { rows } = await db.pool.query(
    `SELECT payload ->> 'id' AS id, count(*)::int AS n FROM ${db.names.messages} WHERE queue = $1 GROUP BY 1`,
    [queue],
  );
  return new Map(rows.map((r) => [r.id as string, r.n as number]));
}

async function publishDoomed(): Promise<string[]> {
  return db.inTransaction((c) =>
    outbox.publishMany(
      c,
      "doomed",
      Array.from({ length: 300 }, (_, i) => ({
        payload: { i },
        ...(i % 3 === 0 ? { key: `k${i % 10}` } : {}),
      })),
    ),
  );
}

describe("a worker killed while it moves messages to the dead letters and announces them", () => {
  it("to a queue: the failure event exists if and only if the dead letter does, exactly once", async () => {
    const ids = await publishDoomed();
    const { hooked } = await killAndRestart("queue", 6);
    expect(hooked).toBeGreaterThan(0);
    const dead = await db.pool.query(
      `SELECT d.id::text AS id FROM ${db.names.deadLetters} AS d ORDER BY d.id`,
    );
    expect(dead.rows.map((r) => r.id)).toEqual(ids);
    const events = await eventsPerDeadLetter("failures");
    expect(ids.filter((id) => events.get(id) !== 1)).toEqual([]);
    expect(events.size).toBe(ids.length);
  }, 900_000);

  it("to a topic: each subscriber holds exactly one event per dead letter", async () => {
    await subscribe(db.pool, { schema: db.schema, topic: "doomed.failed", queue: "alerts" });
    await subscribe(db.pool, { schema: db.schema, topic: "doomed.*", queue: "audit" });
    const ids = await publishDoomed();
    await killAndRestart("topic", 4);
    const dead = await db.pool.query(
      `SELECT d.id::text AS id FROM ${db.names.deadLetters} AS d ORDER BY d.id`,
    );
    expect(dead.rows.map((r) => r.id)).toEqual(ids);
    for (const queue of ["alerts", "audit"]) {
      const events = await eventsPerDeadLetter(queue);
      expect(ids.filter((id) => events.get(id) !== 1)).toEqual([]);
      expect(events.size).toBe(ids.length);
    }
  }, 900_000);
});
