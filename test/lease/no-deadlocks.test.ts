import { beforeAll, describe, expect, it } from "vitest";
import { PermanentError } from "../../src/contract/handler-errors.js";
import { replayDeadLetters } from "../../src/inspect/dead-letters.js";
import { createPgLeaseStore } from "../../src/lease/pg-store.js";
import type { Delivery, LeaseStore } from "../../src/lease/store.js";
import { testDatabase } from "../support/database.js";
import { publisherFor, until, workerFactory } from "../support/worker.js";

/**
 * DESIGN §4.18: the worker's statements never deadlock with each other or with publish and replay. Two
 * workers on a keyed queue renew their leases far more often than a handler runs (so renewals keep racing
 * the keyed acks and dead-letter moves of the same rows), while producers publish batches over the same
 * keys and a replay loop brings dead letters back. A deadlock always aborts one side with 40P01: every
 * side's errors are collected, and none may be one.
 */
const db = testDatabase("nodl");
const workers = workerFactory(db);
const outbox = publisherFor(db.schema);

beforeAll(() => db.migrate());

const KEYS = 24;
const BATCHES = 60;
const PER_BATCH = 20;

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
const isDeadlock = (error: unknown) => (error as { code?: string } | null)?.code === "40P01";

describe("the worker's statements, producers and replay", () => {
  it("never deadlock: keyed acks, dead-letter moves and lease renewals lock rows in one order", {
    timeout: 180_000,
  }, async () => {
    const errors: unknown[] = [];
    const firstRun = new Set<string>();
    const handled = new Set<string>();
    const handler = async (_p: unknown, m: { id: string }) => {
      await sleep(5 + Math.random() * 20);
      // One message in seven is rejected on its first run (a dead letter for the replay loop), then succeeds.
      if (Number(m.id) % 7 === 0 && !firstRun.has(m.id)) {
        firstRun.add(m.id);
        throw new PermanentError("first run refused");
      }
      handled.add(m.id);
    };
    const fleet = await Promise.all(
      [0, 1].map(() =>
        workers.start({
          concurrency: 8,
          leaseTtlMs: 2000,
          // Far shorter than a handler: renewals overlap every ack of the rows they renew.
          heartbeatMs: 2,
          queues: { kd: handler },
        }),
      ),
    );
    for (const w of fleet) w.on("loop_error", (e) => errors.push(e.error));

    let producing = true;
    const ids: string[] = [];
    const producers = Promise.all(
      [0, 1, 2].map(async (p) => {
        for (let b = p; b < BATCHES; b += 3) {
          // Keys in a shuffled order within each batch: publishMany must take their locks sorted.
          const items = Array.from({ length: PER_BATCH }, (_, i) => ({
            payload: { b, i },
            key: `k${(b * 7 + i * 13) % KEYS}`,
          }));
          try {
            ids.push(...(await db.inTransaction((c) => outbox.publishMany(c, "kd", items))));
          } catch (error) {
            errors.push(error);
          }
        }
      }),
    ).finally(() => {
      producing = false;
    });
    const replayer = (async () => {
      while (producing || handled.size < ids.length) {
        try {
          await replayDeadLetters(db.pool, db.schema, { all: true });
        } catch (error) {
          errors.push(error);
        }
        await sleep(5);
      }
    })();

    await producers;
    // A deadlock ends the wait at once: the worker that lost it may have given up on its batch.
    await until(
      () => handled.size === ids.length || errors.some(isDeadlock),
      "every message handled",
      150_000,
    ).catch((error) => {
      throw new Error(
        `${error.message} (${handled.size} of ${ids.length} handled; errors: ${[...new Set(errors.map((e) => (e as { code?: string }).code ?? String(e)))].join(", ")})`,
      );
    });
    producing = false;
    handled.add("stop");
    await replayer;
    expect(errors.filter(isDeadlock)).toEqual([]);
    expect(ids).toHaveLength(BATCHES * PER_BATCH);
  });
});

describe("a lease renewal racing a completion of the same rows", () => {
  const ROWS = 300;
  const store = (): LeaseStore =>
    createPgLeaseStore({
      leaseTtlMs: 30_000,
      workerId: "w",
      maxErrorLength: 4000,
      pool: () => db.pool,
      names: db.names,
      queues: ["race"],
      synchronousCommit: false,
      preparedStatements: true,
      queryTimeoutMs: 20_000,
    });

  /** Rows of distinct keys (every one a head, as the keyed ack expects), leased by `s`. */
  async function leased(s: LeaseStore): Promise<Delivery[]> {
    await db.pool.query(
      `INSERT INTO ${db.names.messages} (queue, payload, key) SELECT 'race', '{}', 'k' || g FROM generate_series(1, $1) AS g`,
      [ROWS],
    );
    const { token, rows } = await s.lease(ROWS);
    expect(rows).toHaveLength(ROWS);
    return rows.map((r) => ({ id: r.id, token, queue: r.queue, key: r.key }));
  }

  it("never deadlocks, whatever order the caller names the rows in", { timeout: 120_000 }, async () => {
    const s = store();
    // The heartbeat names its rows in the order it holds them, the completer in the order they finished:
    // here exactly opposite, on two connections at once, round after round.
    for (let round = 0; round < 6; round++) {
      const ds = await leased(s);
      const reversed = [...ds].reverse();
      const writes =
        round % 3 === 0
          ? s.ack(reversed.map((held) => ({ held })))
          : round % 3 === 1
            ? s.deadLetter(
                reversed.map((held) => ({ held, reason: "rejected", error: "x", attempted: 1, failed: 1 })),
              )
            : s.retry(reversed.map((held) => ({ held, delayMs: 0, error: "x", failed: 1 })));
      const settled = await Promise.allSettled([s.renew(ds), writes, s.renew(ds)]);
      const deadlocks = settled.filter((r) => r.status === "rejected" && isDeadlock(r.reason));
      expect(deadlocks, `round ${round}`).toEqual([]);
      for (const r of settled) if (r.status === "rejected") throw r.reason;
      await db.pool.query(`TRUNCATE ${db.names.messages}, ${db.names.deadLetters}`);
    }
  });
});
