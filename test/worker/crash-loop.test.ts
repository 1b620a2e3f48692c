// A crash loop's culprit is isolated (DESIGN §4 invariant 23): a message that SIGKILLs its worker every time
// it runs, among innocent ones, three worker processes restarted whenever one dies. The rows a crashed
// worker held (its lease ran out, or its batch's transaction died) are leased again alone, each by a worker
// holding nothing else, so only the poison message is charged its crashes: it ends in the dead letters as
// `max_deliveries`, and every innocent message runs and is acked, none dead-lettered (a message that never
// ran, above all). The fixture (test/support/fixtures/crash-loop-worker.ts) writes each run to a ledger
// before its handler does anything.
import { type ChildProcess, spawn } from "node:child_process";
import path from "node:path";
import { afterAll, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { testDatabase } from "../support/database.js";
import { publisherFor, until } from "../support/worker.js";

const db = testDatabase("crashloop");
const outbox = publisherFor(db.schema);
const ledger = `"${db.schema}".ledger`;
const MESSAGES = 60;
const POISON_AT = 5;
const MAX_DELIVERIES = 3;

const children = new Set<ChildProcess>();
let stopping = false;

/** Three workers; one that dies is started again (as a supervisor would), until the test stops them. */
function supervise(mode: string): { crashes: () => number } {
  let crashes = 0;
  let generation = 0;
  const launch = (slot: number) => {
    const child = spawn(
      process.execPath,
      ["--import", "tsx", path.resolve("test/support/fixtures/crash-loop-worker.ts")],
      {
        stdio: ["ignore", "ignore", "inherit"],
        env: {
          ...process.env,
          DATABASE_URL: db.url,
          OUTBOX_SCHEMA: db.schema,
          WORKER_ID: `cl-${mode}-${slot}-${generation++}`,
          LEASE_MODE: mode,
          LEASE_TTL_MS: "1000",
          MAX_DELIVERIES: String(MAX_DELIVERIES),
          PGAPPNAME: `crash-loop ledger ${mode}`,
        },
      },
    );
    children.add(child);
    child.once("exit", (_code, signal) => {
      children.delete(child);
      if (signal === "SIGKILL" && !stopping) crashes++;
      if (!stopping) launch(slot);
    });
  };
  for (let slot = 0; slot < 3; slot++) launch(slot);
  return { crashes: () => crashes };
}

async function stopAll(): Promise<void> {
  stopping = true;
  const exits = [...children].map((c) => new Promise<void>((resolve) => c.once("exit", () => resolve())));
  for (const c of children) c.kill("SIGKILL");
  await Promise.all(exits);
  stopping = false;
}

const count = async (sql: string, params: unknown[] = []) =>
  (await db.pool.query<{ n: number }>(sql, params)).rows[0]?.n ?? 0;

beforeAll(async () => {
  await db.migrate();
  await db.pool.query(
    `CREATE TABLE ${ledger} (id bigint NOT NULL, worker text NOT NULL, deliveries int NOT NULL, at timestamptz NOT NULL)`,
  );
});
beforeEach(async () => {
  await db.pool.query(`TRUNCATE ${ledger}, ${db.names.messages}, ${db.names.deadLetters}`);
});
afterAll(stopAll);

describe.each(["token", "transaction"])("a crash loop (leaseMode %s)", (mode) => {
  it("dead-letters its culprit as max_deliveries and no innocent message; every innocent one runs", async () => {
    const ids = await db.inTransaction((c) =>
      outbox.publishMany(
        c,
        "crash.loop",
        Array.from({ length: MESSAGES }, (_, i) => ({
          payload: i === POISON_AT - 1 ? { poison: true } : { i },
        })),
      ),
    );
    const poison = ids[POISON_AT - 1] as string;
    const workers = supervise(mode);
    await until(
      async () => (await count(`SELECT count(*)::int AS n FROM ${db.names.messages}`)) === 0,
      "every message acked or dead-lettered",
      120_000,
    );
    const crashes = workers.crashes();
    await stopAll();

    const dead = await db.pool.query<{ id: string; reason: string; ran: boolean }>(
      `SELECT d.id::text, d.reason, EXISTS (SELECT 1 FROM ${ledger} AS l WHERE l.id = d.id) AS ran
       FROM ${db.names.deadLetters} AS d ORDER BY d.id`,
    );
    expect(dead.rows).toEqual([{ id: poison, reason: "max_deliveries", ran: true }]);
    // The culprit ran until it was charged maxDeliveries crashes, each one a crash of its own: in token mode
    // its first (batch) lease counted as one; in transaction mode only runs alone count, after however many
    // batch runs crashed before a repair marked it.
    const poisonRuns = await count(`SELECT count(*)::int AS n FROM ${ledger} WHERE id = $1`, [poison]);
    if (mode === "token") expect(poisonRuns).toBe(MAX_DELIVERIES);
    else expect(poisonRuns).toBeGreaterThanOrEqual(MAX_DELIVERIES);
    expect(crashes).toBeGreaterThanOrEqual(MAX_DELIVERIES);
    const innocentsRan = await count(`SELECT count(DISTINCT id)::int AS n FROM ${ledger} WHERE id <> $1`, [
      poison,
    ]);
    expect(innocentsRan).toBe(MESSAGES - 1);
  });
});
