import type pg from "pg";
import { beforeAll, beforeEach, describe, expect, it } from "vitest";
import type { CancelResult } from "../../src/contract/publish-options.js";
import { testDatabase } from "../support/database.js";
import { publisherFor, until, workerFactory } from "../support/worker.js";

/**
 * `cancel` against messages a worker holds (issue 41, item 4), in both lease modes: it never waits for a
 * batch or a handler, answers `delivering` for a row a live lease or batch holds, never answers `cancelled`
 * for a message whose handler ran, and leaves no lock behind that the worker's ack needs.
 */

const db = testDatabase("cxl");
const workers = workerFactory(db);
const outbox = publisherFor(db.schema);
const m = db.names.messages;
const guards = `${db.names.quotedSchema}.lease_guards`;

beforeAll(() => db.migrate());
beforeEach(async () => {
  await db.pool.query(`TRUNCATE ${m}, ${db.names.deadLetters}, ${guards}`);
});

/** A promise the test resolves when it chooses. */
function gate() {
  let open!: () => void;
  const opened = new Promise<void>((resolve) => {
    open = resolve;
  });
  return { open, opened };
}

const count = async (where = "true", params: unknown[] = []) =>
  Number((await db.pool.query(`SELECT count(*) AS n FROM ${m} WHERE ${where}`, params)).rows[0].n);

async function backendPid(client: pg.PoolClient): Promise<number> {
  return (await client.query<{ pid: number }>("SELECT pg_backend_pid() AS pid")).rows[0]?.pid as number;
}

/** Whether the backend `pid` waits for a heavyweight lock (a row's, a transaction's, an advisory one). */
async function waitingForLock(pid: number): Promise<boolean> {
  const { rows } = await db.pool.query("SELECT wait_event_type FROM pg_stat_activity WHERE pid = $1", [pid]);
  return rows[0]?.wait_event_type === "Lock";
}

/** Advisory locks the backend `pid` holds (the key locks). */
async function advisoryLocks(pid: number): Promise<number> {
  const { rows } = await db.pool.query(
    "SELECT count(*)::int AS n FROM pg_locks WHERE locktype = 'advisory' AND granted AND pid = $1",
    [pid],
  );
  return rows[0]?.n as number;
}

/**
 * Runs the cancel on `client` (in its open transaction) and waits until it has answered or its backend
 * waits for a lock: the answer, or "waiting" (what a cancel must never do behind a held row).
 */
async function cancelOrWait(client: pg.PoolClient, dedupeKey: string): Promise<CancelResult | "waiting"> {
  const pid = await backendPid(client);
  let answer: CancelResult | undefined;
  const pending = outbox.cancel(client, "jobs", dedupeKey).then((r) => {
    answer = r;
  });
  await until(
    async () => answer !== undefined || (await waitingForLock(pid)),
    "the cancel answered or waiting",
  );
  if (answer) return answer;
  // Let it finish once the test's gates open, so its connection goes back clean.
  pending.catch(() => {});
  return "waiting";
}

describe.each(["transaction", "token"] as const)("cancel racing a worker (leaseMode %s)", (leaseMode) => {
  it("never answers cancelled for a message whose handler ran, and never makes a batch commit without its ack", {
    timeout: 120_000,
  }, async () => {
    // 40 keys × 5 messages, each with a dedupe key. Every handler cancels its own message while it holds
    // it (racing its ack), and every other message also a later one of its key (racing the promotion).
    const KEYS = 40;
    const PER_KEY = 5;
    const dedupe = (k: number, n: number) => `k${k}-${n}`;
    const ids = new Map<string, string>();
    await db.inTransaction(async (c) => {
      for (let n = 0; n < PER_KEY; n++)
        for (let k = 0; k < KEYS; k++) {
          const key = dedupe(k, n);
          const { id } = await outbox.publish(c, "jobs", { k, n }, { key: `K${k}`, dedupeKey: key });
          ids.set(id, key);
        }
    });
    const ran = new Map<string, number>();
    const cancels: Promise<{ dedupeKey: string; answer: CancelResult }>[] = [];
    const cancel = (dedupeKey: string) =>
      cancels.push(
        db
          .inTransaction((c) => outbox.cancel(c, "jobs", dedupeKey))
          .then((answer) => ({ dedupeKey, answer })),
      );
    await workers.start({
      leaseMode,
      concurrency: 8,
      batchSize: 20,
      queues: {
        jobs: async (payload, msg) => {
          const { k, n } = payload as { k: number; n: number };
          ran.set(msg.id, (ran.get(msg.id) ?? 0) + 1);
          // Not awaited: a handler waiting for a cancel that waits for its batch would never end.
          cancel(dedupe(k, n));
          if (n % 2 === 0 && n + 2 < PER_KEY) cancel(dedupe(k, n + 2));
          // Returns without them: the row stays held until the ack (in transaction mode, until the batch's
          // last handler ended and it commits), so the cancels land before, during and after it.
          await new Promise((resolve) => setImmediate(resolve));
        },
      },
    });
    await until(async () => (await count()) === 0, "every message handled or cancelled", 100_000);
    const answers = await Promise.all(cancels);
    const cancelled = answers.flatMap((a) => (a.answer.status === "cancelled" ? [a.answer.id] : []));
    // (1) No cancel removed a message whose handler ran.
    expect(cancelled.filter((id) => ran.has(id))).toEqual([]);
    // No delivery ran twice: no batch committed without its ack (a key lock a cancel kept busy).
    expect([...ran].filter(([, n]) => n > 1)).toEqual([]);
    // Nothing lost: each message either ran or was cancelled.
    expect(new Set([...ran.keys(), ...cancelled])).toEqual(new Set(ids.keys()));
  });

  it("answers delivering for a message whose handler runs, without waiting for it, and keeps no lock the ack needs", {
    timeout: 60_000,
  }, async () => {
    const held = await db.inTransaction((c) =>
      outbox.publish(c, "jobs", { n: 1 }, { key: "K", dedupeKey: "held" }),
    );
    const started = gate();
    const release = gate();
    const runs: string[] = [];
    await workers.start({
      leaseMode,
      queues: {
        jobs: async (_p, msg) => {
          runs.push(msg.id);
          started.open();
          await release.opened;
        },
      },
    });
    await started.opened;
    const canceller = await db.pool.connect();
    try {
      await canceller.query("BEGIN");
      // The handler is still blocked on `release`: the answer must come before it.
      expect(await cancelOrWait(canceller, "held")).toEqual({ status: "delivering", id: held.id });
      // The caller's transaction stays open, holding nothing of the key's: the handler's ack (which takes
      // the key's lock to hand the turn on) lands before the caller commits.
      expect(await advisoryLocks(await backendPid(canceller))).toBe(0);
      release.open();
      await until(
        async () => (await count()) === 0,
        "the message acked while the cancel's transaction is open",
      );
      await canceller.query("COMMIT");
    } finally {
      release.open();
      await canceller.query("ROLLBACK").catch(() => {});
      canceller.release();
    }
    expect(runs).toEqual([held.id]);
  });

  it("answers delivering for a held message at once, even while a producer of its key keeps the key's lock", {
    timeout: 60_000,
  }, async () => {
    const held = await db.inTransaction((c) =>
      outbox.publish(c, "jobs", { n: 1 }, { key: "K", dedupeKey: "held" }),
    );
    const started = gate();
    const release = gate();
    await workers.start({
      leaseMode,
      queues: {
        jobs: async () => {
          started.open();
          await release.opened;
        },
      },
    });
    await started.opened;
    const producer = await db.pool.connect();
    const canceller = await db.pool.connect();
    try {
      // In flight: the key's lock is held until this commits (a batch writing the key's outcome holds it
      // the same way): the held row's answer needs no key lock.
      await producer.query("BEGIN");
      await outbox.publish(producer, "jobs", { n: 2 }, { key: "K" });
      await canceller.query("BEGIN");
      expect(await cancelOrWait(canceller, "held")).toEqual({ status: "delivering", id: held.id });
      await canceller.query("COMMIT");
      await producer.query("COMMIT");
    } finally {
      release.open();
      await producer.query("ROLLBACK").catch(() => {});
      await canceller.query("ROLLBACK").catch(() => {});
      producer.release();
      canceller.release();
    }
    await until(async () => (await count()) === 0, "both delivered");
  });
});

describe("cancel and row locks", () => {
  it("answers delivering for a row another transaction has locked (a batch whose guard is not committed yet), without waiting, and keeps no key lock", async () => {
    const row = await db.inTransaction((c) =>
      outbox.publish(c, "jobs", { n: 1 }, { key: "K", dedupeKey: "locked" }),
    );
    const locker = await db.pool.connect();
    const canceller = await db.pool.connect();
    try {
      // As a batch's lease holds its rows: FOR UPDATE, no lease written, no guard (yet).
      await locker.query("BEGIN");
      await locker.query(`SELECT id FROM ${m} WHERE id = $1 FOR UPDATE`, [row.id]);
      await canceller.query("BEGIN");
      expect(await cancelOrWait(canceller, "locked")).toEqual({ status: "delivering", id: row.id });
      expect(await advisoryLocks(await backendPid(canceller))).toBe(0);
      await canceller.query("COMMIT");
      await locker.query("COMMIT");
    } finally {
      await locker.query("ROLLBACK").catch(() => {});
      await canceller.query("ROLLBACK").catch(() => {});
      locker.release();
      canceller.release();
    }
    // Nothing was removed: the holder decides.
    expect(await count("id = $1", [row.id])).toBe(1);
  });

  it.each([
    ["keyless", undefined],
    ["keyed", "K"],
  ])(
    "a second cancel of a %s message another cancel removed answers not_found once that one commits, never delivering",
    async (_kind, key) => {
      const row = await db.inTransaction((c) =>
        outbox.publish(c, "jobs", {}, { dedupeKey: "twice", ...(key ? { key } : {}) }),
      );
      const first = await db.pool.connect();
      const second = await db.pool.connect();
      try {
        await first.query("BEGIN");
        expect(await outbox.cancel(first, "jobs", "twice")).toEqual({ status: "cancelled", id: row.id });
        await second.query("BEGIN");
        // The first's deletion locks the row: a lock no worker holds. The second waits for the first's
        // transaction (an advisory lock only cancels and producers take), not a worker's.
        const pid = await backendPid(second);
        let settled = false;
        const answer = outbox.cancel(second, "jobs", "twice").finally(() => {
          settled = true;
        });
        await until(
          async () => settled || (await waitingForLock(pid)),
          "the second cancel answered or waiting",
        );
        await first.query("COMMIT");
        expect(await answer).toEqual({ status: "not_found" });
        await second.query("COMMIT");
      } finally {
        await first.query("ROLLBACK").catch(() => {});
        await second.query("ROLLBACK").catch(() => {});
        first.release();
        second.release();
      }
    },
  );

  it("a message waiting for a retry (its handler failed) is still cancelled", async () => {
    const row = await db.inTransaction((c) => outbox.publish(c, "jobs", {}, { dedupeKey: "retrying" }));
    const failed = gate();
    await workers.start({
      leaseMode: "transaction",
      retry: () => 3_600_000,
      queues: {
        jobs: async () => {
          failed.open();
          throw new Error("not yet");
        },
      },
    });
    await failed.opened;
    await until(
      async () => (await count("id = $1 AND attempts_count = 1", [row.id])) === 1,
      "the retry written",
    );
    expect(await db.inTransaction((c) => outbox.cancel(c, "jobs", "retrying"))).toEqual({
      status: "cancelled",
      id: row.id,
    });
  });
});
