import type { PoolClient } from "pg";
import { beforeAll, beforeEach, describe, expect, it } from "vitest";
import { constant, type MessageContext, PermanentError, replayDeadLetters } from "../../src/index.js";
import { completeStatements } from "../../src/sql/complete.js";
import { runQuery } from "../../src/sql/executor.js";
import { repairKeyHeadsStatement } from "../../src/sql/key-heads.js";
import { testDatabase } from "../support/database.js";
import { memoryLogger } from "../support/memory-logger.js";
import { publisherFor, until, workerFactory } from "../support/worker.js";

/**
 * Per-key FIFO (DESIGN §3a, invariant 11): messages of one queue with the same key are handled one at a
 * time, in id order; keyless ones stay parallel. Each test here fails when the code that keeps its part of
 * the guarantee is taken out (see the mutations in the issue-12 note).
 */

const db = testDatabase("kord");
const workers = workerFactory(db);
const outbox = publisherFor(db.schema);

beforeAll(() => db.migrate());
beforeEach(async () => {
  await db.pool.query(`TRUNCATE ${db.names.messages}, ${db.names.deadLetters}`);
});

type Item = { payload: unknown; key?: string; delayMs?: number };

function publishMany(queue: string, items: Item[]): Promise<string[]> {
  return db.inTransaction((c) => outbox.publishMany(c, queue, items));
}

const remaining = async () =>
  (await db.pool.query(`SELECT count(*)::int AS n FROM ${db.names.messages}`)).rows[0].n as number;

/** Records every handler run: start, end, and how many handlers of the same key ran at once. */
function tracker() {
  const runs: { id: string; key: string | null; start: number; end: number; ok: boolean }[] = [];
  const running = new Map<string, number>();
  let maxPerKey = 0;
  let maxOverall = 0;
  let overall = 0;
  return {
    runs,
    maxPerKey: () => maxPerKey,
    maxOverall: () => maxOverall,
    async run(message: MessageContext, work: () => Promise<unknown>) {
      const k = message.key ?? `#${message.id}`;
      running.set(k, (running.get(k) ?? 0) + 1);
      overall++;
      maxPerKey = Math.max(maxPerKey, running.get(k) ?? 0);
      maxOverall = Math.max(maxOverall, overall);
      const entry = { id: message.id, key: message.key, start: performance.now(), end: 0, ok: false };
      runs.push(entry);
      try {
        await work();
        entry.ok = true;
      } finally {
        entry.end = performance.now();
        running.set(k, (running.get(k) ?? 1) - 1);
        overall--;
      }
    },
    /** Ids of successful runs of `key`, in the order they ended. */
    done: (key: string) => runs.filter((r) => r.key === key && r.ok).map((r) => r.id),
  };
}

/** A promise the test resolves when it chooses (Node 20 has no Promise.withResolvers). */
function gate() {
  let resolve!: () => void;
  const promise = new Promise<void>((r) => {
    resolve = r;
  });
  return { promise, resolve };
}

const pause = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** The session `pid` waits for an advisory lock (a key's). */
async function waitsOnKeyLock(pid: number): Promise<boolean> {
  const { rows } = await db.pool.query(
    "SELECT count(*)::int AS n FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND pid = $1",
    [pid],
  );
  return rows[0].n > 0;
}

describe("per-key ordering", () => {
  it("runs 12 messages of one key one at a time, in id order, at concurrency 16", async () => {
    const t = tracker();
    const ids = await publishMany(
      "orders",
      Array.from({ length: 12 }, (_, i) => ({ payload: { i }, key: "order-1" })),
    );
    await workers.start({
      concurrency: 16,
      queues: { orders: (_p, m) => t.run(m, () => pause(3 + (Number(m.id) % 4) * 3)) },
    });
    await until(async () => (await remaining()) === 0, "every message handled");
    expect(t.done("order-1")).toEqual(ids);
    expect(t.maxPerKey()).toBe(1);
  });

  it("keys holding quotes, backslashes, dollars and SQL pass through completion and promotion intact", async () => {
    const t = tracker();
    const keys = ["o'brien", "back\\slash\\", "$1 $2", "'); DROP TABLE x; --", "ключ 🔑"];
    const items = keys.flatMap((key) => [1, 2, 3].map((n) => ({ payload: { n }, key })));
    const ids = await publishMany("quoted", items);
    await workers.start({ concurrency: 16, queues: { quoted: (_p, m) => t.run(m, () => pause(1)) } });
    await until(async () => (await remaining()) === 0, "every message handled");
    for (const key of keys) expect(t.done(key)).toEqual(ids.filter((_, i) => items[i]?.key === key));
    expect(t.maxPerKey()).toBe(1);
  });

  it("keeps keyless messages and different keys parallel", async () => {
    const t = tracker();
    const release = gate();
    await publishMany("mixed", [
      ...Array.from({ length: 6 }, (_, i) => ({ payload: { i } })),
      ...Array.from({ length: 6 }, (_, i) => ({ payload: { i }, key: `k${i}` })),
    ]);
    await workers.start({
      concurrency: 16,
      queues: { mixed: (_p, m) => t.run(m, () => release.promise) },
    });
    // All twelve run at once: six keyless and six distinct keys.
    await until(() => t.runs.length === 12, "twelve handlers running together");
    release.resolve();
    await until(async () => (await remaining()) === 0, "every message handled");
    expect(t.maxOverall()).toBe(12);
  });

  it("blocks a key behind a failing head until it succeeds (retries with backoff)", async () => {
    const t = tracker();
    const [first, second, third] = await publishMany("retrying", [
      { payload: { n: 1 }, key: "a" },
      { payload: { n: 2 }, key: "a" },
      { payload: { n: 3 }, key: "a" },
    ]);
    let failures = 0;
    await workers.start({
      concurrency: 8,
      queues: {
        retrying: {
          retry: constant(30),
          handler: (_p, m) =>
            t.run(m, async () => {
              if (m.id === first && failures < 3) {
                failures++;
                throw new Error("not yet");
              }
            }),
        },
      },
    });
    await until(async () => (await remaining()) === 0, "every message handled");
    expect(failures).toBe(3);
    expect(t.done("a")).toEqual([first, second, third]);
    // No run of the later messages started before the head's successful end.
    const headEnd = t.runs.find((r) => r.id === first && r.ok)?.end ?? Number.NaN;
    for (const r of t.runs.filter((r) => r.id !== first)) expect(r.start).toBeGreaterThanOrEqual(headEnd);
  });

  it("blocks a key behind a delayed head; other keys go ahead", async () => {
    const t = tracker();
    // Due in an hour: only the test makes it due, once the other key's message is done (not a race
    // between a short delay and the worker's start on a busy machine).
    const [late, behind, other] = await publishMany("delayed", [
      { payload: { n: 1 }, key: "a", delayMs: 3_600_000 },
      { payload: { n: 2 }, key: "a" },
      { payload: { n: 3 }, key: "b" },
    ]);
    // `behind` and `other` are ready before the worker starts: one fetch would take both if the key let it.
    await workers.start({ concurrency: 8, queues: { delayed: (_p, m) => t.run(m, async () => {}) } });
    await until(() => t.done("b").length === 1, "the other key's message handled");
    await db.pool.query(`UPDATE ${db.names.messages} SET available_at = now() WHERE id = $1`, [late]);
    await until(async () => (await remaining()) === 0, "every message handled");
    expect(t.runs.map((r) => r.id)).toEqual([other, late, behind]);
  });

  it("a dead-lettered head unblocks its key; replaying it puts it right after the message in flight", async () => {
    const t = tracker();
    const [poison, next, last] = await publishMany("poison", [
      { payload: { n: 1 }, key: "a" },
      { payload: { n: 2 }, key: "a" },
      { payload: { n: 3 }, key: "a" },
    ]);
    const hold = gate();
    let replayed = false;
    await workers.start({
      concurrency: 8,
      queues: {
        poison: (_p, m) =>
          t.run(m, async () => {
            if (m.id === poison && !replayed) throw new PermanentError("bad");
            if (m.id === next) await hold.promise;
          }),
      },
    });
    await until(() => t.runs.some((r) => r.id === next), "the next message of the key started");
    // The dead letter comes back while `next` runs, with its old id: it waits behind `next` and runs
    // before `last` (a key's rows run in id order, and it has the smallest).
    replayed = true;
    await replayDeadLetters(db.pool, db.schema, { ids: [poison as string] });
    hold.resolve();
    await until(async () => (await remaining()) === 0, "every message handled");
    expect(t.done("a")).toEqual([next, poison, last]);
    expect(t.maxPerKey()).toBe(1);
  });

  it("hands buffered keyed rows back at stop; the next worker keeps the order", async () => {
    const t = tracker();
    const ids = await publishMany(
      "handback",
      Array.from({ length: 40 }, (_, i) => ({ payload: { i }, key: `k${i % 4}` })),
    );
    const slow = gate();
    // One dispatch loop, the first message blocked: the other keys' heads are leased and buffered.
    const first = await workers.start({
      concurrency: 1,
      queues: { handback: (_p, m) => t.run(m, () => slow.promise) },
    });
    await until(() => t.runs.length === 1, "the first handler running");
    const stopping = first.stop({ timeoutMs: 5000 });
    slow.resolve();
    await stopping;
    await workers.start({ concurrency: 8, queues: { handback: (_p, m) => t.run(m, () => pause(2)) } });
    await until(async () => (await remaining()) === 0, "every message handled");
    for (let k = 0; k < 4; k++) {
      expect(t.done(`k${k}`)).toEqual(ids.filter((_, i) => i % 4 === k));
    }
    expect(t.maxPerKey()).toBe(1);
  });

  it("a key whose head was deleted by hand goes on with its next message (the head repair)", async () => {
    const t = tracker();
    const [gone, second, third] = await publishMany(
      "by-hand",
      [1, 2, 3].map((n) => ({ payload: { n }, key: "a" })),
    );
    // An operator removes the head outside the worker: nothing promotes the next row.
    await db.pool.query(`DELETE FROM ${db.names.messages} WHERE id = $1`, [gone]);
    const log = memoryLogger();
    await workers.start({
      logger: log.logger,
      concurrency: 4,
      queues: { "by-hand": (_p, m) => t.run(m, async () => {}) },
    });
    await until(async () => (await remaining()) === 0, "the key's other messages handled");
    expect(t.done("a")).toEqual([second, third]);
    expect(log.lines.filter((l) => l.msg.startsWith("keys without a head"))).toMatchObject([
      { keys: 1, ids: [second] },
    ]);
  });

  it("the head repair leaves a key alone while it has a head, even behind an older row put back", async () => {
    // A replayed dead letter comes back with its old id, behind the head in flight: not a headless key.
    const [older] = await publishMany("repair", [{ payload: { n: 0 } }]);
    await db.pool.query(`DELETE FROM ${db.names.messages} WHERE id = $1`, [older]);
    const [head] = await publishMany("repair", [{ payload: { n: 1 }, key: "z" }]);
    await db.pool.query(
      `INSERT INTO ${db.names.messages} (id, queue, payload, key) OVERRIDING SYSTEM VALUE
       VALUES ($1, 'repair', '{"n":0}', 'z')`,
      [older],
    );
    const repair = repairKeyHeadsStatement(db.names);
    expect(await runQuery(db.pool, repair, { queues: ["repair"] })).toEqual([]);
    const { rows } = await db.pool.query(
      `SELECT id::text, head FROM ${db.names.messages} WHERE key = 'z' ORDER BY id`,
    );
    expect(rows).toEqual([
      { id: older, head: false },
      { id: head, head: true },
    ]);
    // Once the head is gone, the repair makes the oldest row left the head.
    await db.pool.query(`DELETE FROM ${db.names.messages} WHERE id = $1`, [head]);
    expect(await runQuery(db.pool, repair, { queues: ["repair"] })).toEqual([{ id: older }]);
  });

  it("an unordered queue (ordered: false) runs same-key messages in parallel", async () => {
    const t = tracker();
    const release = gate();
    await publishMany(
      "metrics",
      Array.from({ length: 6 }, (_, i) => ({ payload: { i }, key: "same" })),
    );
    await workers.start({
      concurrency: 8,
      queues: { metrics: { ordered: false, handler: (_p, m) => t.run(m, () => release.promise) } },
    });
    await until(() => t.runs.length === 6, "six same-key handlers running together");
    release.resolve();
    await until(async () => (await remaining()) === 0, "every message handled");
    expect(t.maxPerKey()).toBe(6);
  });

  it("orders rows a plain SQL INSERT writes (the key-head trigger), batch inserts included", async () => {
    const t = tracker();
    const { rows } = await db.pool.query<{ id: string }>(
      `INSERT INTO ${db.names.messages} (queue, payload, key)
       SELECT 'plain', jsonb_build_object('i', g), 'k' || (g % 3) FROM generate_series(1, 30) AS g
       RETURNING id::text`,
    );
    const { rows: heads } = await db.pool.query(
      `SELECT count(*) FILTER (WHERE head)::int AS heads FROM ${db.names.messages}`,
    );
    expect(heads[0].heads).toBe(3);
    await workers.start({ concurrency: 16, queues: { plain: (_p, m) => t.run(m, () => pause(1)) } });
    await until(async () => (await remaining()) === 0, "every message handled");
    for (let k = 0; k < 3; k++) {
      expect(t.done(`k${k}`)).toEqual(rows.map((r) => r.id).filter((_, i) => (i + 1) % 3 === k));
    }
    expect(t.maxPerKey()).toBe(1);
  });
});

describe("commit order: publish serialises producers of one key", () => {
  it.each(["publish", "publishMany"] as const)(
    "a second same-key %s waits for the first transaction, and takes its id after it",
    async (how) => {
      const a = await db.pool.connect();
      const b = await db.pool.connect();
      try {
        await a.query("BEGIN");
        await b.query("BEGIN");
        const bPid = (await b.query("SELECT pg_backend_pid() AS pid")).rows[0].pid as number;
        const [first] = await outbox.publishMany(a, "serial", [{ payload: { n: 1 }, key: "k" }]);
        // b publishes the same key: it must wait for a's commit (its lock), not draw its id now.
        let bDone = false;
        const bPublish = (
          how === "publish"
            ? outbox.publish(b, "serial", { n: 2 }, { key: "k" }).then((id) => [id])
            : outbox.publishMany(b, "serial", [{ payload: { n: 2 }, key: "k" }])
        ).then(([id]) => {
          bDone = true;
          return id;
        });
        await until(() => waitsOnKeyLock(bPid), "b waiting on the key lock");
        // Meanwhile a keyless publish commits and draws an id.
        const [between] = await db.inTransaction((c) =>
          outbox.publishMany(c, "serial", [{ payload: { n: "keyless" } }]),
        );
        expect(bDone).toBe(false);
        await a.query("COMMIT");
        const second = (await bPublish) as string;
        await b.query("COMMIT");
        // b's id was drawn after a committed: ids of one key follow commit order.
        expect(Number(second)).toBeGreaterThan(Number(between));
        expect(Number(second)).toBeGreaterThan(Number(first));
        const t = tracker();
        await workers.start({ concurrency: 8, queues: { serial: (_p, m) => t.run(m, async () => {}) } });
        await until(async () => (await remaining()) === 0, "every message handled");
        expect(t.done("k")).toEqual([first, second]);
      } finally {
        await a.query("ROLLBACK").catch(() => {});
        await b.query("ROLLBACK").catch(() => {});
        a.release();
        b.release();
      }
    },
  );

  it("a plain-SQL row whose id was drawn before the key's lock runs right after the head it waited behind", async () => {
    // `early` inserts without taking the key's lock first: its id is drawn, then the trigger waits for the
    // lock that `late` holds. `late` commits a later id first, which heads the key; `early`'s row comes in
    // below it, and must be found when that head is acked (the promotion otherwise looks above the head).
    const m = db.names.messages;
    const early = await db.pool.connect();
    const late = await db.pool.connect();
    try {
      await early.query("BEGIN");
      await late.query("BEGIN");
      await late.query("SELECT pg_advisory_xact_lock(hashtext('plainrace'), hashtext('k'))");
      const earlyPid = (await early.query("SELECT pg_backend_pid() AS pid")).rows[0].pid as number;
      const insert = (c: PoolClient, n: number) =>
        c
          .query<{ id: string }>(
            `INSERT INTO ${m} (queue, payload, key) VALUES ('plainrace', jsonb_build_object('n', ${n}), 'k') RETURNING id::text`,
          )
          .then((r) => r.rows[0]?.id as string);
      const earlyInsert = insert(early, 1);
      await until(() => waitsOnKeyLock(earlyPid), "early waiting on the key lock, its id drawn");
      const lateId = await insert(late, 2);
      await late.query("COMMIT");
      const earlyId = await earlyInsert;
      await early.query("COMMIT");
      expect(Number(earlyId)).toBeLessThan(Number(lateId));
      const [after] = await publishMany("plainrace", [{ payload: { n: 3 }, key: "k" }]);
      const t = tracker();
      await workers.start({ concurrency: 8, queues: { plainrace: (_p, msg) => t.run(msg, async () => {}) } });
      await until(async () => (await remaining()) === 0, "every message handled");
      // Commit order for the two racing producers (the plain-SQL note of docs/guide/ordering.md), then the later publish.
      expect(t.done("k")).toEqual([lateId, earlyId, after]);
    } finally {
      await early.query("ROLLBACK").catch(() => {});
      await late.query("ROLLBACK").catch(() => {});
      early.release();
      late.release();
    }
  });

  it("two batches taking the same keys in opposite orders never deadlock", async () => {
    for (let round = 0; round < 3; round++) {
      const [a, b] = [`a${round}`, `b${round}`];
      const clients = await Promise.all([db.pool.connect(), db.pool.connect(), db.pool.connect()]);
      const [holder, one, two] = clients as [PoolClient, PoolClient, PoolClient];
      try {
        for (const c of clients) await c.query("BEGIN");
        const pids = await Promise.all(
          [one, two].map(async (c) => (await c.query("SELECT pg_backend_pid() AS p")).rows[0].p as number),
        );
        // The holder has key a: both batches queue up behind it, the second already holding b if its
        // locks were taken in its own (b, a) order. The first then gets a and waits for b: deadlock.
        await outbox.publish(holder, "opposite", { n: 0 }, { key: a });
        const publishAndCommit = async (c: PoolClient, keys: string[]) => {
          await outbox.publishMany(
            c,
            "opposite",
            keys.map((key) => ({ payload: { key }, key })),
          );
          await c.query("COMMIT");
        };
        const waiting = async (n: number) =>
          until(
            async () =>
              (
                await db.pool.query(
                  "SELECT count(*)::int AS n FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND pid = ANY($1)",
                  [pids],
                )
              ).rows[0].n === n,
            `${n} batch(es) waiting`,
          );
        // One queues first for a (Postgres grants it first); two then comes with (b, a).
        const first = publishAndCommit(one, [a, b]);
        await waiting(1);
        const second = publishAndCommit(two, [b, a]);
        await waiting(2);
        await holder.query("COMMIT");
        await Promise.all([first, second]);
      } finally {
        for (const c of clients) {
          await c.query("ROLLBACK").catch(() => {});
          c.release();
        }
      }
    }
  });

  it("a keyed ack or dead-letter move locks the keys of its own heads only, not every leased row's", async () => {
    // 300 keys, one head each: another worker holds 250 leased, this one 50. A lock tried on every leased
    // row the planner scans would hold the other worker's keys until commit: its acks would come back busy
    // and its producers would wait.
    await db.pool.query(
      `INSERT INTO ${db.names.messages} (queue, payload, key) SELECT 'locks', '{}', 'k' || g FROM generate_series(1, 300) AS g`,
    );
    const lease = async (token: string, n: number) =>
      (
        await db.pool.query(
          `UPDATE ${db.names.messages} SET acquired_token = $1, acquired_at = now(), lease_expires_at = now() + interval '1 minute'
           WHERE id IN (SELECT id FROM ${db.names.messages} WHERE acquired_token IS NULL ORDER BY id LIMIT $2)
           RETURNING id::text`,
          [token, n],
        )
      ).rows.map((r) => r.id as string);
    await lease("00000000-0000-4000-8000-00000000000b", 250);
    const mine = "00000000-0000-4000-8000-00000000000a";
    const ids = await lease(mine, 50);
    await db.pool.query(`ANALYZE ${db.names.messages}`);
    const sql = completeStatements(db.names, { synchronousCommit: true });
    const ownLocks = (c: PoolClient) =>
      c
        .query(
          "SELECT count(*)::int AS n FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()",
        )
        .then((r) => r.rows[0].n as number);
    const half = ids.slice(0, 25);
    const tokens = (xs: string[]) => xs.map(() => mine);
    // Both run in a transaction rolled back at the end, so the locks can be counted before commit.
    await db.inTransaction(async (c) => {
      const rows = await runQuery(c, sql.ackKeyed, {
        ids: half,
        tokens: tokens(half),
        limit: 0,
        token: mine,
        leaseTtlMs: 60_000,
        workerId: "w",
      });
      expect(rows.find((r) => r.kind === "deleted")?.delivery).toBe("25");
      expect(await ownLocks(c)).toBe(25);
    }, true);
    const rest = ids.slice(25);
    await db.inTransaction(async (c) => {
      const [row] = await runQuery(c, sql.deadKeyed, {
        ids: rest,
        tokens: tokens(rest),
        reasons: rest.map(() => "permanent"),
        errors: rest.map(() => null),
        attempted: rest.map(() => 1),
        failed: rest.map(() => 1),
        maxErrorLength: 100,
      });
      expect(row?.head_keys).toHaveLength(25);
      expect(await ownLocks(c)).toBe(25);
    }, true);
  });

  it("a producer holding a key past the query timeout: the head's ack waits (its lease renewed), other keys go on, nothing fails", async () => {
    // A busy key is not a failed write: a producer may hold its key for as long as its transaction runs.
    // Counted as a failure, it stopped the worker after maxConsecutiveFailures, and a lease left to run
    // out delivered the handled head again.
    const t = tracker();
    const [head] = await publishMany("held", [{ payload: { n: 1 }, key: "k" }]);
    const producer = await db.pool.connect();
    const problems: string[] = [];
    try {
      await producer.query("BEGIN");
      const [next] = await outbox.publishMany(producer, "held", [{ payload: { n: 2 }, key: "k" }]);
      // A query timeout no plain statement reaches on a busy machine: the held key outlasts it many times.
      const worker = await workers.start({
        concurrency: 4,
        leaseTtlMs: 4000,
        queryTimeoutMs: 1000,
        maxConsecutiveFailures: 3,
        loopBackoffBaseMs: 10,
        loopBackoffMaxMs: 50,
        queues: { held: (_p, m) => t.run(m, () => Promise.resolve()) },
      });
      for (const event of ["loop_error", "fatal", "lease_lost"] as const) {
        worker.on(event, () => problems.push(event));
      }
      await until(() => t.done("k").length === 1, "the head handled");
      // Its ack finds the key's lock busy. Still held after 4 s of renewals, four query timeouts later.
      await until(
        async () => {
          const { rows } = await db.pool.query(
            `SELECT lease_expires_at - acquired_at > interval '8 seconds' AS long FROM ${db.names.messages} WHERE id = $1`,
            [head],
          );
          return rows[0]?.long === true;
        },
        "the head's lease renewed for 4 s",
        60_000,
      );
      const others = await publishMany("held", [{ payload: { n: 3 }, key: "other" }, { payload: { n: 4 } }]);
      await until(
        () => others.every((id) => t.runs.some((r) => r.id === id && r.ok)),
        "the other messages handled",
      );
      // Their acks land while the head's is still busy: only the head is left.
      await until(async () => (await remaining()) === 1, "the other messages acknowledged");
      expect(problems).toEqual([]);
      await producer.query("COMMIT");
      await until(async () => (await remaining()) === 0, "the key going on after the commit");
      expect(t.done("k")).toEqual([head, next]);
      expect(t.runs.filter((r) => r.id === head)).toHaveLength(1);
      expect(problems).toEqual([]);
    } finally {
      await producer.query("ROLLBACK").catch(() => {});
      producer.release();
    }
  });

  it("never strands a key when its head is acked while a producer of that key is in flight", async () => {
    // The producer sees the head (not committed gone yet) and marks its row "not head"; the ack must not
    // choose the successor before that row is committed, or the key would have no head for good.
    const t = tracker();
    const [head] = await publishMany("race", [{ payload: { n: 1 }, key: "k" }]);
    const producer = await db.pool.connect();
    try {
      await producer.query("BEGIN");
      const hold = gate();
      const log = memoryLogger();
      log.logger.level = "debug";
      await workers.start({
        logger: log.logger,
        concurrency: 4,
        queues: { race: (_p, m) => t.run(m, () => (m.id === head ? hold.promise : Promise.resolve())) },
      });
      await until(() => t.runs.length === 1, "the head running");
      const [next] = await outbox.publishMany(producer, "race", [{ payload: { n: 2 }, key: "k" }]);
      hold.resolve();
      // The head's ack finds the key's lock busy (the producer): the head stays in place until it commits.
      await until(() => log.lines.some((l) => l.msg.startsWith("key heads kept in place")), "a deferred ack");
      // The head is still there (the producer's row is not committed, so not counted).
      expect(await remaining()).toBe(1);
      await producer.query("COMMIT");
      await until(async () => (await remaining()) === 0, "the producer's row handled after its commit");
      expect(t.done("k")).toEqual([head, next]);
    } finally {
      await producer.query("ROLLBACK").catch(() => {});
      producer.release();
    }
  });
});
