import { beforeAll, beforeEach, describe, expect, it } from "vitest";
import { constant } from "../../src/retry/strategies.js";
import { testDatabase } from "../support/database.js";
import { nextEvent, publisherFor, until, workerFactory } from "../support/worker.js";

/** DESIGN §4.14: no hung handler holds a lease forever. */
const db = testDatabase("hto");
const workers = workerFactory(db);
const outbox = publisherFor(db.schema);

beforeAll(() => db.migrate());
beforeEach(async () => {
  await db.pool.query(`TRUNCATE ${db.names.messages}, ${db.names.deadLetters}`);
});

async function publish(queue: string, n = 1): Promise<string[]> {
  return db.inTransaction((c) =>
    outbox.publishMany(
      c,
      queue,
      Array.from({ length: n }, (_, i) => ({ payload: { i } })),
    ),
  );
}

async function row(id: string) {
  const { rows } = await db.pool.query(
    `SELECT attempts_count, failures_count, last_error, acquired_token, available_at > now() AS scheduled
     FROM ${db.names.messages} WHERE id = $1`,
    [id],
  );
  return rows[0];
}

const never = () => new Promise<void>(() => {});

describe("handler timeout", () => {
  it("aborts the handler's signal, counts a failed attempt as a timeout and gives the lease back for a retry with backoff", async () => {
    const [id] = await publish("slow");
    let reason: unknown;
    const worker = await workers.start({
      queues: {
        slow: {
          timeoutMs: 200,
          retry: constant(60_000),
          handler: (_p, m) =>
            new Promise<void>((resolve) => {
              m.signal.addEventListener("abort", () => {
                reason = m.signal.reason;
                // Returning after the abort changes nothing: the attempt already failed.
                resolve();
              });
            }),
        },
      },
    });
    const retried = await nextEvent<{ id: string; timedOut: boolean; error: string }>(worker, "retried");
    expect(retried).toMatchObject({ id, timedOut: true });
    expect(retried.error).toMatch(/HandlerTimeoutError: handler did not finish within 200 ms \(timeout\)/);
    expect((reason as Error).name).toBe("HandlerTimeoutError");
    expect(await row(id as string)).toMatchObject({
      attempts_count: 1,
      failures_count: 1,
      acquired_token: null,
      scheduled: true,
      last_error: expect.stringContaining("timeout"),
    });
  });

  it("ends a message whose handler always hangs in dead letters with reason timeout after maxAttempts", async () => {
    const [id] = await publish("hangs");
    const timeouts: number[] = [];
    const worker = await workers.start({
      handlerTimeoutMs: 150,
      queues: { hangs: { maxAttempts: 2, retry: constant(10), handler: never } },
    });
    worker.on("handler_timeout", (e) => timeouts.push(e.stillRunning));
    const dead = await nextEvent<{ id: string; reason: string }>(worker, "dead_lettered", undefined, 10_000);
    expect(dead).toMatchObject({ id, reason: "timeout" });
    const { rows } = await db.pool.query(
      `SELECT reason, attempts_count, failures_count, error FROM ${db.names.deadLetters} WHERE id = $1`,
      [id],
    );
    expect(rows[0]).toMatchObject({ reason: "timeout", attempts_count: 2, failures_count: 2 });
    expect(rows[0].error).toContain("within 150 ms");
    // Both handlers ignored their signal and never returned: both still count as running somewhere.
    expect(timeouts).toEqual([1, 2]);
  });

  it("frees the concurrency slot of a handler that ignores its signal", async () => {
    await publish("stuck");
    const handled: string[] = [];
    const worker = await workers.start({
      concurrency: 1,
      queues: {
        stuck: { timeoutMs: 200, retry: constant(60_000), handler: never },
        next: (_p, m) => void handled.push(m.id),
      },
    });
    const timedOut = nextEvent<{ stillRunning: number }>(worker, "handler_timeout");
    await until(
      async () =>
        (
          await row(
            (
              await db.pool.query(`SELECT id FROM ${db.names.messages} WHERE queue = 'stuck'`)
            ).rows[0].id,
          )
        ).acquired_token !== null,
      "stuck handler running",
    );
    const [next] = await publish("next");
    // The only slot is taken by a handler that will never return; the next message still runs.
    await until(() => handled.length === 1, "the next message handled after the timeout freed the slot");
    expect(handled).toEqual([next]);
    expect((await timedOut).stillRunning).toBe(1);
  });

  it("uses the worker's handlerTimeoutMs unless the queue sets its own", async () => {
    await publish("patient");
    await publish("impatient");
    const outcomes: string[] = [];
    const worker = await workers.start({
      handlerTimeoutMs: 150,
      queues: {
        // Longer than the worker's timeout, shorter than its own: acked.
        patient: { timeoutMs: 60_000, handler: () => new Promise<void>((r) => setTimeout(r, 400)) },
        impatient: { retry: constant(60_000), handler: never },
      },
    });
    worker.on("acked", (e) => outcomes.push(`acked ${e.queue}`));
    worker.on("retried", (e) => outcomes.push(`retried ${e.queue}${e.timedOut ? " (timeout)" : ""}`));
    await until(() => outcomes.length === 2, "both outcomes");
    expect(outcomes.sort()).toEqual(["acked patient", "retried impatient (timeout)"]);
  });
});
