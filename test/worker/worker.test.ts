import { randomUUID } from "node:crypto";
import { beforeAll, beforeEach, describe, expect, it } from "vitest";
import { z } from "zod";
import { PermanentError, TransientError } from "../../src/contract/handler-errors.js";
import { defineQueue } from "../../src/produce/queue.js";
import { constant } from "../../src/retry/strategies.js";
import { completeStatements } from "../../src/sql/complete.js";
import { runQuery } from "../../src/sql/executor.js";
import { aloneStatement, fetchStatement } from "../../src/sql/fetch.js";
import { testDatabase } from "../support/database.js";
import { nextEvent, publisherFor, until, workerFactory } from "../support/worker.js";

const db = testDatabase("wrk");
const workers = workerFactory(db);
const outbox = publisherFor(db.schema);

beforeAll(() => db.migrate());
beforeEach(async () => {
  await db.pool.query(`TRUNCATE ${db.names.messages}, ${db.names.deadLetters}`);
});

async function publishRows(queue: string, n: number, payload: (i: number) => unknown = (i) => ({ i })) {
  const ids: string[] = [];
  for (let start = 0; start < n; start += 1000) {
    const items = Array.from({ length: Math.min(1000, n - start) }, (_, k) => ({
      payload: payload(start + k),
    }));
    ids.push(...(await db.inTransaction((c) => outbox.publishMany(c, queue, items))));
  }
  return ids;
}

async function count(table: "messages" | "dead_letters", where = "true"): Promise<number> {
  const name = table === "messages" ? db.names.messages : db.names.deadLetters;
  return (await db.pool.query(`SELECT count(*)::int AS n FROM ${name} WHERE ${where}`)).rows[0].n;
}

describe("delivery", () => {
  it("8 workers drain 5,000 rows: every id handled exactly once, the table ends empty", async () => {
    const ids = await publishRows("drain", 5000);
    const ledger = new Map<string, number>();
    const fleet = await Promise.all(
      Array.from({ length: 8 }, () =>
        workers.start({
          concurrency: 4,
          batchSize: 50,
          queues: { drain: (_p, m) => void ledger.set(m.id, (ledger.get(m.id) ?? 0) + 1) },
        }),
      ),
    );
    await until(async () => (await count("messages")) === 0, "table empty", 30_000);
    expect(ledger.size).toBe(5000);
    expect([...ledger.values()].every((n) => n === 1)).toBe(true);
    expect(new Set(ledger.keys())).toEqual(new Set(ids));
    expect(fleet.every((w) => w.held === 0)).toBe(true);
  });

  it("gives handlers the typed payload and the message metadata", async () => {
    const q = defineQueue(
      "typed",
      z.object({ n: z.number(), when: z.string().transform((s) => new Date(s)) }),
    );
    const [id] = await db.inTransaction((c) =>
      outbox.publishMany(c, q, [
        { payload: { n: 7, when: "2026-01-01T00:00:00Z" }, key: "k1", headers: { h: "v" } },
      ]),
    );
    const [{ created_at }] = (
      await db.pool.query(`SELECT created_at FROM ${db.names.messages} WHERE id = $1`, [id])
    ).rows;
    const seen: unknown[] = [];
    const worker = await workers.start({
      queues: {
        typed: {
          schema: z.object({ n: z.number(), when: z.string() }),
          handler: (payload, m) => {
            seen.push({
              payload,
              id: m.id,
              key: m.key,
              headers: m.headers,
              deliveries: m.deliveries,
              attempts: m.attempts,
              createdAt: m.createdAt,
            });
            expect(m.signal.aborted).toBe(false);
            expect(m.topic).toBeNull();
            expect(JSON.parse(JSON.stringify(m))).toEqual({
              id,
              queue: "typed",
              topic: null,
              key: "k1",
              headers: { h: "v" },
              deliveries: 1,
              attempts: 0,
              createdAt: m.createdAt.toISOString(),
            });
          },
        },
      },
    });
    await nextEvent(worker, "acked");
    expect(seen).toEqual([
      {
        payload: { n: 7, when: "2026-01-01T00:00:00.000Z" },
        id,
        key: "k1",
        headers: { h: "v" },
        deliveries: 1,
        attempts: 0,
        createdAt: created_at,
      },
    ]);
  });

  it("a plain SQL insert with no notification is delivered by polling", async () => {
    const got: string[] = [];
    const worker = await workers.start({ listen: false, queues: { sqlq: (_p, m) => void got.push(m.id) } });
    await db.pool.query(`INSERT INTO ${db.names.messages} (queue, payload) VALUES ('sqlq', '{}')`);
    await nextEvent(worker, "acked");
    expect(got).toHaveLength(1);
  });

  it("never touches queues it does not serve", async () => {
    await publishRows("other", 3);
    const worker = await workers.start({ queues: { mine: () => {} } });
    await publishRows("mine", 1);
    await nextEvent(worker, "acked");
    expect(await count("messages", "queue = 'other' AND acquired_token IS NULL")).toBe(3);
  });
});

describe("outcomes", () => {
  it("an invalid payload goes to dead letters as invalid_payload, without running the handler", async () => {
    await publishRows("strict", 1, () => ({ n: "not a number" }));
    let ran = false;
    const worker = await workers.start({
      queues: {
        strict: {
          schema: z.object({ n: z.number() }),
          handler: () => {
            ran = true;
          },
        },
      },
    });
    const dead = await nextEvent<{ reason: string; error: string }>(worker, "dead_lettered");
    expect(dead.reason).toBe("invalid_payload");
    expect(dead.error).toContain("n:");
    expect(ran).toBe(false);
    const { rows } = await db.pool.query(
      `SELECT reason, error, attempts_count, payload FROM ${db.names.deadLetters}`,
    );
    expect(rows).toEqual([
      { reason: "invalid_payload", error: dead.error, attempts_count: 0, payload: { n: "not a number" } },
    ]);
    expect(await count("messages")).toBe(0);
  });

  it("a PermanentError dead-letters at once as rejected, with the error and the attempt", async () => {
    await publishRows("perm", 1);
    const worker = await workers.start({
      queues: { perm: () => Promise.reject(new PermanentError("customer does not exist")) },
    });
    await nextEvent(worker, "dead_lettered");
    const { rows } = await db.pool.query(
      `SELECT reason, error, attempts_count, failures_count, deliveries_count, first_attempt_at IS NOT NULL AS tried
       FROM ${db.names.deadLetters}`,
    );
    expect(rows).toEqual([
      {
        reason: "rejected",
        error: "PermanentError: customer does not exist",
        attempts_count: 1,
        failures_count: 1,
        deliveries_count: 1,
        tried: true,
      },
    ]);
  });

  it("other errors retry at the computed time on the server clock, then dead-letter as retries_exhausted", async () => {
    await publishRows("flaky", 1);
    let calls = 0;
    const worker = await workers.start({
      retry: constant(60_000),
      maxAttempts: 3,
      queues: {
        flaky: () => {
          calls++;
          throw new Error(`boom ${calls}`);
        },
      },
    });
    const retried = await nextEvent<{ delayMs: number }>(worker, "retried");
    expect(retried.delayMs).toBe(60_000);
    const { rows } = await db.pool.query(
      `SELECT attempts_count, failures_count, last_error, acquired_token,
              round(extract(epoch FROM available_at - last_attempt_at) * 1000) AS delay_ms
       FROM ${db.names.messages}`,
    );
    expect(rows).toEqual([
      {
        attempts_count: 1,
        failures_count: 1,
        last_error: "Error: boom 1",
        acquired_token: null,
        delay_ms: "60000",
      },
    ]);
    // Bring the retry forward instead of waiting a minute, twice; the third failure is the last.
    for (const attempt of [2, 3]) {
      await db.pool.query(`UPDATE ${db.names.messages} SET available_at = now()`);
      if (attempt === 2) await nextEvent(worker, "retried");
    }
    const dead = await nextEvent<{ reason: string }>(worker, "dead_lettered");
    expect(dead.reason).toBe("retries_exhausted");
    expect(calls).toBe(3);
    const dl = await db.pool.query(
      `SELECT attempts_count, failures_count, error FROM ${db.names.deadLetters}`,
    );
    expect(dl.rows).toEqual([{ attempts_count: 3, failures_count: 3, error: "Error: boom 3" }]);
  });

  it("transient errors retry without counting towards maxAttempts", async () => {
    await publishRows("outage", 1);
    let calls = 0;
    const worker = await workers.start({
      retry: constant(60_000),
      maxAttempts: 1,
      queues: {
        outage: () => {
          calls++;
          if (calls <= 3)
            throw Object.assign(new Error("connect ECONNREFUSED 127.0.0.1:9"), { code: "ECONNREFUSED" });
          if (calls === 4) throw new TransientError("broker busy");
        },
      },
    });
    for (let i = 0; i < 4; i++) {
      const r = await nextEvent<{ transient: boolean }>(worker, "retried");
      expect(r.transient).toBe(true);
      await db.pool.query(`UPDATE ${db.names.messages} SET available_at = now()`);
    }
    await nextEvent(worker, "acked");
    expect(calls).toBe(5);
    expect(await count("dead_letters")).toBe(0);
  });

  it("a transient outage longer than maxDeliveries tries is retried until delivered, never dead-lettered", async () => {
    const ids = await publishRows("long-outage", 5);
    const calls = new Map<string, number>();
    const worker = await workers.start({
      maxDeliveries: 3,
      retry: constant(20),
      queues: {
        "long-outage": (_p, m) => {
          const n = (calls.get(m.id) ?? 0) + 1;
          calls.set(m.id, n);
          if (n <= 8) throw new TransientError(`destination down (${n})`);
        },
      },
    });
    const dead: unknown[] = [];
    worker.on("dead_lettered", (e) => dead.push(e));
    await until(async () => (await count("messages")) === 0 || dead.length > 0, "all delivered", 30_000);
    expect(dead).toEqual([]);
    expect(await count("dead_letters")).toBe(0);
    expect(ids.map((id) => calls.get(id))).toEqual([9, 9, 9, 9, 9]);
  });

  it("a row whose deliveries end without an outcome is still dead-lettered after maxDeliveries", async () => {
    await publishRows("crash-loop", 2);
    // Row 1: three recorded attempts and two deliveries that ended with nothing written (crashes): the next
    // lease is its third unrecorded delivery, over maxDeliveries 2. Row 2: the same recorded attempts and
    // one crash: it runs.
    await db.pool.query(
      `UPDATE ${db.names.messages} SET attempts_count = 3, deliveries_count = CASE WHEN id = (SELECT min(id) FROM ${db.names.messages}) THEN 5 ELSE 4 END`,
    );
    const ran: string[] = [];
    const worker = await workers.start({
      maxDeliveries: 2,
      queues: { "crash-loop": (_p, m) => void ran.push(m.id) },
    });
    const dead = await nextEvent<{ reason: string; id: string }>(worker, "dead_lettered");
    expect(dead.reason).toBe("max_deliveries");
    await until(async () => (await count("messages")) === 0, "the other row acked");
    const dl = await db.pool.query(`SELECT id::text, error FROM ${db.names.deadLetters}`);
    expect(dl.rows).toHaveLength(1);
    expect(ran).toHaveLength(1);
    expect(ran[0]).not.toBe(dl.rows[0].id);
    expect(dl.rows[0].error).toMatch(/without an outcome/);
  });

  it("a row leased more than maxDeliveries times is dead-lettered before its handler runs", async () => {
    await publishRows("crashy", 1);
    await db.pool.query(`UPDATE ${db.names.messages} SET deliveries_count = 5`);
    let ran = false;
    const worker = await workers.start({
      maxDeliveries: 5,
      queues: {
        crashy: () => {
          ran = true;
        },
      },
    });
    const dead = await nextEvent<{ reason: string }>(worker, "dead_lettered");
    expect(dead.reason).toBe("max_deliveries");
    expect(ran).toBe(false);
  });

  it("a throwing event listener does not break the worker", async () => {
    await publishRows("ev", 2);
    const worker = await workers.start({ concurrency: 1, queues: { ev: () => {} } });
    worker.on("acked", () => {
      throw new Error("listener bug");
    });
    await until(async () => (await count("messages")) === 0, "both acked");
  });
});

describe("lease fencing", () => {
  it("the worker's writes skip the WAL flush wait in their own transaction only, unless synchronousCommit is set", async () => {
    const serverDefault = (await db.pool.query("SHOW synchronous_commit")).rows[0].synchronous_commit;
    expect(serverDefault).not.toBe("off");
    for (const [sync, expected] of [
      [false, "off"],
      [true, serverDefault],
    ] as const) {
      await publishRows("sync", 1);
      const client = await db.pool.connect();
      try {
        // Inside an explicit transaction the statement's transaction-local setting stays visible until COMMIT.
        await client.query("BEGIN");
        const [row] = await runQuery(client, fetchStatement(db.names, { synchronousCommit: sync }), {
          queues: ["sync"],
          limit: 1,
          token: randomUUID(),
          leaseTtlMs: 60_000,
          workerId: "w",
        });
        expect(row).toBeDefined();
        expect((await client.query("SHOW synchronous_commit")).rows[0].synchronous_commit).toBe(expected);
        await client.query("COMMIT");
        // Never a session setting: behind a transaction pooler it would stick to a shared server connection.
        expect((await client.query("SHOW synchronous_commit")).rows[0].synchronous_commit).toBe(
          serverDefault,
        );
      } finally {
        client.release();
      }
      await db.pool.query(`DELETE FROM ${db.names.messages} WHERE queue = 'sync'`);
    }
  });

  it("the ack statement deletes only (id, token) pairs it still owns and names them when some are missing", async () => {
    await publishRows("ackq", 3);
    const token = randomUUID();
    const leased = await runQuery(db.pool, fetchStatement(db.names, { synchronousCommit: false }), {
      queues: ["ackq"],
      limit: 10,
      token: token,
      leaseTtlMs: 60_000,
      workerId: "w",
    });
    const [a, b, c] = leased.map((r) => r.id);
    const ack = completeStatements(db.names, { synchronousCommit: false }).ack;
    // A wrong token deletes nothing, and says so with an empty list (not "all").
    expect(await runQuery(db.pool, ack, { ids: [a ?? ""], tokens: [randomUUID()] })).toEqual([
      { deleted: 0, keys: [] },
    ]);
    // Partly ours: only the owned rows go, and they are named by delivery (id and token), not by id: the
    // same id may be in the batch twice, once under an older token of this worker's.
    expect(
      await runQuery(db.pool, ack, {
        ids: [a, b, a].map(String),
        tokens: [token, randomUUID(), randomUUID()],
      }),
    ).toEqual([{ deleted: 1, keys: [`${a}/${token}`] }]);
    // All ours: no per-row data.
    expect(
      await runQuery(db.pool, ack, {
        ids: [b, c].map(String),
        tokens: [token, token],
      }),
    ).toEqual([{ deleted: 2, keys: null }]);
    expect(await count("messages")).toBe(0);
  });

  it("a zombie's ack and retry affect 0 rows and emit lease_lost; the new owner's write lands", async () => {
    await publishRows("zombie", 2, (i) => ({ i }));
    const gates: (() => void)[] = [];
    const lost: { id: string; phase: string }[] = [];
    const worker = await workers.start({
      leaseTtlMs: 60_000,
      heartbeatMs: 30_000,
      concurrency: 2,
      queues: {
        zombie: (payload) =>
          new Promise<void>((resolve, reject) =>
            gates.push((payload as { i: number }).i === 0 ? resolve : () => reject(new Error("fails late"))),
          ),
      },
    });
    worker.on("lease_lost", (e) => lost.push(e));
    await until(() => gates.length === 2, "both handlers running");
    // Both leases run out under the zombie (as if its heartbeat had stalled) and another worker takes over.
    await db.pool.query(`UPDATE ${db.names.messages} SET lease_expires_at = now() - interval '1 second'`);
    // Rows whose lease ran out are taken alone, one per lease: here both under one token, one at a time.
    const token = randomUUID();
    const alone = aloneStatement(db.names, { synchronousCommit: false });
    const take = { queues: ["zombie"], token, leaseTtlMs: 60_000, workerId: "new-owner" };
    const taken = [...(await runQuery(db.pool, alone, take)), ...(await runQuery(db.pool, alone, take))];
    expect(taken).toHaveLength(2);
    for (const open of gates) open();
    await until(() => lost.length === 2, "two lease_lost events");
    expect(lost.map((l) => l.phase).sort()).toEqual(["ack", "retry"]);
    const { rows } = await db.pool.query(
      `SELECT acquired_by, attempts_count FROM ${db.names.messages} ORDER BY id`,
    );
    expect(rows).toEqual([
      { acquired_by: "new-owner", attempts_count: 0 },
      { acquired_by: "new-owner", attempts_count: 0 },
    ]);
    const acked = await runQuery(db.pool, completeStatements(db.names, { synchronousCommit: false }).ack, {
      ids: taken.map((r) => r.id),
      tokens: taken.map(() => token),
    });
    expect(acked).toEqual([{ deleted: 2, keys: null }]);
  });

  it("a handler longer than the lease TTL runs exactly once while its heartbeat renews the lease", async () => {
    await publishRows("slow", 1);
    let runs = 0;
    let probed = false;
    // Renewed every 300 ms for 3 s: a renewal may come well over a second late on a busy machine and
    // still be in time.
    const slowWorker = await workers.start({
      leaseTtlMs: 3000,
      heartbeatMs: 300,
      queues: {
        slow: async () => {
          runs++;
          // Runs until the competitor has looked for rows after this lease, unrenewed, would have expired.
          await until(() => probed, "the competitor fetched after the first lease's TTL");
        },
      },
    });
    await until(async () => (await count("messages", "acquired_token IS NOT NULL")) === 1, "row leased");
    // A probe the competitor can lease only once the slow row's first lease has run past its TTL: the same
    // fetch would have taken the slow row too, had the heartbeat not renewed it.
    await db.pool.query(
      `INSERT INTO ${db.names.messages} (queue, payload, available_at)
       SELECT 'probe', '{}', acquired_at + interval '3100 milliseconds' FROM ${db.names.messages}`,
    );
    // A second worker polls the same queue the whole time, ready to take an expired lease.
    await workers.start({
      leaseTtlMs: 3000,
      heartbeatMs: 300,
      queues: {
        slow: () => void runs++,
        probe: () => {
          probed = true;
        },
      },
    });
    await nextEvent(slowWorker, "acked");
    expect(runs).toBe(1);
  });

  it("a lease lost during a handler aborts its signal and its outcome is not written", async () => {
    await publishRows("abort", 1);
    let aborted = false;
    let started!: () => void;
    const running = new Promise<void>((r) => {
      started = r;
    });
    const worker = await workers.start({
      leaseTtlMs: 60_000,
      heartbeatMs: 250,
      queues: {
        abort: (_p, m) =>
          new Promise<void>((resolve) => {
            started();
            m.signal.addEventListener("abort", () => {
              aborted = true;
              resolve();
            });
          }),
      },
    });
    await running;
    // Another worker takes the row over: the next heartbeat finds the token gone.
    await db.pool.query(
      `UPDATE ${db.names.messages} SET acquired_token = gen_random_uuid(), acquired_by = 'thief'`,
    );
    const e = await nextEvent<{ phase: string }>(worker, "lease_lost");
    expect(e.phase).toBe("heartbeat");
    await until(() => aborted, "handler aborted");
    expect(await count("messages", "acquired_by = 'thief'")).toBe(1);
  });
});

describe("graceful stop", () => {
  it("releases rows fetched but not started, so another worker takes them at once", async () => {
    // A quick "warm" row first: once a handler has finished fast, the worker queues rows locally.
    await publishRows("warm", 1);
    await publishRows("stopq", 20);
    let release!: () => void;
    const gate = new Promise<void>((r) => {
      release = r;
    });
    const handled: string[] = [];
    const first = await workers.start({
      concurrency: 1,
      batchSize: 20,
      queues: {
        warm: () => {},
        stopq: async (_p, m) => {
          handled.push(m.id);
          await gate;
        },
      },
    });
    await until(() => handled.length === 1 && first.held === 20, "one running, nineteen queued");
    const stopping = first.stop({ timeoutMs: 5000 });
    await until(async () => (await count("messages", "acquired_token IS NULL")) === 19, "19 released");
    expect(await count("messages", "acquired_token IS NULL AND deliveries_count = 0")).toBe(19);
    release();
    const result = await stopping;
    expect(result).toEqual({ drained: true, released: 19, abandoned: [] });
    expect(await count("messages")).toBe(19);
    const second = await workers.start({ queues: { stopq: (_p, m) => void handled.push(m.id) } });
    await until(async () => (await count("messages")) === 0, "second worker drains");
    expect(new Set(handled).size).toBe(20);
    await second.stop();
  });

  it("past the timeout, aborts handlers, leaves their leases to expire and says so", async () => {
    await publishRows("hang", 1);
    let signal: AbortSignal | undefined;
    const worker = await workers.start({
      queues: {
        hang: (_p, m) => {
          signal = m.signal;
          return new Promise<void>(() => {});
        },
      },
    });
    await until(() => signal !== undefined, "handler running");
    const timeout = nextEvent<{ abandoned: string[] }>(worker, "drain_timeout");
    const result = await worker.stop({ timeoutMs: 300 });
    expect(result.drained).toBe(false);
    expect(result.abandoned).toHaveLength(1);
    expect((await timeout).abandoned).toEqual(result.abandoned);
    expect(signal?.aborted).toBe(true);
    expect(await count("messages", "acquired_token IS NOT NULL")).toBe(1);
  });
});

describe("options", () => {
  it("names every wrong field before connecting", async () => {
    const { createWorker } = await import("../../src/worker/worker.js");
    expect(() =>
      createWorker({
        connection: "postgres://x@127.0.0.1:1/x",
        queues: { "bad queue": () => {} },
        leaseTtlMs: 10_000,
        heartbeatMs: 8000,
        minPollIntervalMs: 500,
        maxPollIntervalMs: 100,
        concurrency: 0,
      }),
    ).toThrow(
      /queues\.bad queue: .*heartbeatMs: must be at most half of leaseTtlMs.*minPollIntervalMs: must not exceed/s,
    );
    expect(() => createWorker({ connection: "postgres://x@h/x", queues: {} })).toThrow(
      /serve at least one queue/,
    );
  });
});
