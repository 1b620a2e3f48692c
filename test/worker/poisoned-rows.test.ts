import { beforeAll, beforeEach, describe, expect, it } from "vitest";
import { constant } from "../../src/retry/strategies.js";
import { testDatabase } from "../support/database.js";
import { publisherFor, until, workerFactory } from "../support/worker.js";

/**
 * DESIGN §4.16: whatever a row holds, the lease and completion statements isolate it. Rows written by plain
 * SQL with counters at their limits or odd headers sit beside a healthy queue's rows: every healthy row is
 * delivered, and each odd row ends in dead letters with a reason that names its problem.
 */
const db = testDatabase("poison");
const workers = workerFactory(db);
const outbox = publisherFor(db.schema);
const MAX_INT = 2_147_483_647;

beforeAll(() => db.migrate());
beforeEach(async () => {
  await db.pool.query(`TRUNCATE ${db.names.messages}, ${db.names.deadLetters}`);
});

async function count(table: "messages" | "deadLetters", where = "true"): Promise<number> {
  return (await db.pool.query(`SELECT count(*)::int AS n FROM ${db.names[table]} WHERE ${where}`)).rows[0].n;
}

/** A row as a plain-SQL producer could write it; returns its id. */
async function insertRaw(columns: Record<string, unknown>): Promise<string> {
  const names = Object.keys(columns);
  const { rows } = await db.pool.query(
    `INSERT INTO ${db.names.messages} (${names.join(", ")}) VALUES (${names.map((_, i) => `$${i + 1}`).join(", ")})
     RETURNING id::text`,
    Object.values(columns),
  );
  return rows[0].id;
}

describe("a row whose values sit at a limit", () => {
  it("never stops the lease or completion of other rows, and is dead-lettered naming its problem", async () => {
    const leasedOut = await insertRaw({ queue: "odd", payload: "{}", deliveries_count: MAX_INT });
    const badHeaders = await insertRaw({ queue: "odd", payload: "{}", headers: '{"x-count": 3}' });
    // Fails each time: its retries add to a counter at its limit, its dead-letter move to both.
    const attemptsFull = await insertRaw({
      queue: "odd",
      payload: '{"fail": true}',
      attempts_count: MAX_INT,
    });
    const failuresFull = await insertRaw({
      queue: "odd",
      payload: '{"fail": true}',
      attempts_count: MAX_INT,
      failures_count: MAX_INT - 1,
    });
    // A key whose head is acked hands its next row off in the ack: that lease adds to deliveries_count too.
    const head = await insertRaw({ queue: "odd", payload: "{}", key: "k" });
    const behindHead = await insertRaw({ queue: "odd", payload: "{}", key: "k", deliveries_count: MAX_INT });
    const healthy = await db.inTransaction((c) =>
      outbox.publishMany(
        c,
        "healthy",
        Array.from({ length: 100 }, (_, i) => ({ payload: { i } })),
      ),
    );

    const ran: string[] = [];
    const loopErrors: Error[] = [];
    const worker = await workers.start({
      retry: constant(10),
      maxAttempts: 3,
      queues: {
        odd: (p, m) => {
          ran.push(m.id);
          if ((p as { fail?: boolean }).fail) throw new Error("handler failed");
        },
        healthy: () => {},
      },
    });
    worker.on("loop_error", (e) => loopErrors.push(e.error));

    await until(async () => (await count("messages")) === 0, "every row delivered or dead-lettered", 20_000);
    expect(loopErrors.map((e) => e.message)).toEqual([]);
    expect(await count("deadLetters", "queue = 'healthy'")).toBe(0);
    const dead = await db.pool.query(
      `SELECT id::text, reason, error, attempts_count, failures_count FROM ${db.names.deadLetters} ORDER BY id`,
    );
    expect(dead.rows.map((r) => [r.id, r.reason])).toEqual([
      [leasedOut, "max_deliveries"],
      [badHeaders, "invalid_headers"],
      [attemptsFull, "retries_exhausted"],
      [failuresFull, "retries_exhausted"],
      [behindHead, "max_deliveries"],
    ]);
    expect(dead.rows[0].error).toContain(String(MAX_INT));
    expect(dead.rows[1].error).toContain('"x-count"');
    expect(dead.rows[2]).toMatchObject({ attempts_count: MAX_INT, failures_count: 3 });
    expect(dead.rows[3]).toMatchObject({ attempts_count: MAX_INT, failures_count: MAX_INT });
    expect(dead.rows[4].error).toContain(String(MAX_INT));
    // The odd rows that could run did; the healthy queue was never held up.
    expect(new Set(ran)).toEqual(new Set([attemptsFull, failuresFull, head]));
    expect(healthy).toHaveLength(100);
  });

  it("an infinite timestamp is refused at insert, as the producer's own error", async () => {
    for (const column of ["created_at", "available_at", "first_attempt_at", "last_attempt_at"]) {
      for (const value of ["infinity", "-infinity"]) {
        await expect(
          insertRaw({ queue: "odd", payload: "{}", [column]: value }),
          `${column} ${value}`,
        ).rejects.toMatchObject({
          code: "23514",
          constraint: "messages_finite_times",
        });
      }
    }
    expect(await count("messages")).toBe(0);
  });
});
