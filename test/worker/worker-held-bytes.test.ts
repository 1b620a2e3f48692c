import { randomBytes } from "node:crypto";
import pino from "pino";
import { beforeAll, beforeEach, describe, expect, it } from "vitest";
import { createEngine } from "../../src/worker/engine.js";
import { WorkerEmitter } from "../../src/worker/events.js";
import { LoopHealth } from "../../src/worker/loop-health.js";
import { resolveWorkerOptions } from "../../src/worker/options.js";
import { testDatabase } from "../support/database.js";
import { MemoryLeaseStore, MemoryTable } from "../support/memory-store.js";
import { until, workerFactory } from "../support/worker.js";

// Issue 26 (DESIGN §4, invariant 19): 500 rows of 1 MB, batchSize 500, ten 200 ms handlers: a worker held
// 155 rows and peaked at 574 MB RSS. What a worker fetches and holds is bounded in bytes, not just rows.

const db = testDatabase("heldbytes");
const workers = workerFactory(db);
beforeAll(() => db.migrate());
beforeEach(async () => {
  await db.pool.query(`TRUNCATE ${db.names.messages}, ${db.names.deadLetters}`);
});

const MiB = 2 ** 20;
/** Hex digits: pglz leaves them uncompressed, so a row's stored size is its text's, about 1 MB. */
const MEGABYTE_TEXT = randomBytes(500_000).toString("hex");

/** `n` rows of `queue` whose payload is `{"i": g, "data": text}`. */
async function insertRows(queue: string, n: number, text: string): Promise<void> {
  await db.pool.query(
    `INSERT INTO ${db.names.messages} (queue, payload)
     SELECT $1, jsonb_build_object('i', g, 'data', $3::text) FROM generate_series(1, $2::int) AS g`,
    [queue, n, text],
  );
}

async function count(where: string): Promise<number> {
  const { rows } = await db.pool.query(`SELECT count(*)::int AS n FROM ${db.names.messages} WHERE ${where}`);
  return rows[0].n;
}

/** Samples the rows leased in the table every few ms until stopped; resolves with the most seen. */
function sampleLeased(): { stop(): Promise<number> } {
  let max = 0;
  let on = true;
  const loop = (async () => {
    while (on) {
      max = Math.max(max, await count("acquired_token IS NOT NULL"));
      await new Promise((resolve) => setTimeout(resolve, 5));
    }
  })();
  return {
    async stop() {
      on = false;
      await loop;
      return max;
    },
  };
}

describe("what a worker fetches and holds is bounded in bytes", () => {
  it("with 1 MB rows and an 8 MiB budget, at most 8 rows (plus one) are leased, however many handlers wait", async () => {
    await insertRows("big", 30, MEGABYTE_TEXT);
    // Handlers wait on the latch current when they start: the test lets them go a group at a time.
    const latch = () => {
      let open!: () => void;
      const closed = new Promise<void>((resolve) => {
        open = resolve;
      });
      return { closed, open };
    };
    let current = latch();
    const first = current;
    let started = 0;
    const leased = sampleLeased();
    let mostLeased: number;
    try {
      const w = await workers.start({
        concurrency: 20,
        maxHeldBytes: 8 * MiB,
        queues: {
          big: {
            rawPayload: true,
            handler: async () => {
              started++;
              await current.closed;
            },
          },
        },
      });
      await until(() => started >= 8, "the rows that fit are running");
      // A negative property needs an observation window: fifty poll intervals (20 ms here) in which a worker
      // that counted rows only would lease more for its 12 idle handlers.
      await new Promise((resolve) => setTimeout(resolve, 1000));
      const heldWhileBlocked = w.held;
      // The bytes of rows done are free again: the next rows come in as many at once, not one by one.
      current = latch();
      first.open();
      await until(() => started >= 16, "the next eight running once the first eight are done");
      current.open();
      await until(async () => (await count("true")) === 0, "all 30 delivered", 30_000);
      // 8 × 1,000,0xx bytes fit in 8 MiB; a ninth would be the one row a fetch may take past the budget.
      expect(heldWhileBlocked).toBeLessThanOrEqual(9);
      expect(started).toBe(30);
    } finally {
      first.open();
      current.open();
      mostLeased = await leased.stop();
    }
    expect(mostLeased).toBeLessThanOrEqual(9);
  });

  it("a row larger than the whole budget is still delivered", async () => {
    const twoMegabytes = MEGABYTE_TEXT + MEGABYTE_TEXT;
    await insertRows("huge", 1, twoMegabytes);
    await insertRows("huge", 3, "small");
    const seen: number[] = [];
    await workers.start({
      maxHeldBytes: MiB,
      queues: { huge: { rawPayload: true, handler: (payload) => void seen.push(String(payload).length) } },
    });
    await until(async () => (await count("true")) === 0, "the huge row and the small ones delivered");
    expect(seen).toHaveLength(4);
    expect(seen.filter((chars) => chars > twoMegabytes.length)).toHaveLength(1);
  });

  it("refuses a budget below 64 KiB, naming the field", async () => {
    await expect(workers.start({ maxHeldBytes: 1000, queues: { q: () => {} } })).rejects.toThrow(
      /maxHeldBytes: must be at least 65536/,
    );
  });
});

describe("the prefetch estimate with large rows", () => {
  /**
   * The memory store, with each lease taking 1 ms plus 30 ms per MB it brings: what a fetch of 1 MB rows
   * costs on Postgres (converting jsonb to text, mostly).
   */
  class TransferBoundStore extends MemoryLeaseStore {
    override async lease(limit: number, maxBytes?: number) {
      const lease = await super.lease(limit, maxBytes);
      const bytes = lease.rows.reduce((sum, r) => sum + r.payload.length, 0);
      await new Promise((resolve) => setTimeout(resolve, 1 + (bytes / 1e6) * 30));
      return lease;
    }
  }

  it("a fetch slowed by its bytes does not deepen the prefetch: about a fetch's worth beyond the running handlers", async () => {
    const table = new MemoryTable();
    const rows = 300;
    // One 1 MB string shared by every row: the store hands out the same text, the test holds it once.
    const text = JSON.stringify({ data: "x".repeat(1_000_000) });
    for (let i = 0; i < rows; i++) {
      const row = table.rows.get(table.insert("big"));
      if (row) row.payload = text;
    }
    let done = 0;
    const options = resolveWorkerOptions({
      connection: "postgres://unused@localhost/x",
      workerId: "prefetch",
      logger: false,
      concurrency: 10,
      // The byte budget would bound this too: here the estimate alone is under test.
      maxHeldBytes: 2 ** 40,
      minPollIntervalMs: 5,
      maxPollIntervalMs: 20,
      queues: {
        big: {
          rawPayload: true,
          handler: async () => {
            await new Promise((resolve) => setTimeout(resolve, 200));
            done++;
          },
        },
      },
    });
    const log = pino({ level: "silent" });
    const emitter = new WorkerEmitter(() => {});
    const engine = createEngine({
      options,
      store: new TransferBoundStore(table, { queues: ["big"], leaseTtlMs: 60_000 }),
      log,
      emitter,
      health: new LoopHealth(log, emitter),
      onFatal: () => {},
    });
    // Once handlers have run a while (the first fetches, before any handler finished, ask a loop's worth
    // each): the steady state, where the estimate decides.
    let most = 0;
    const sampler = setInterval(() => {
      if (done < 30) return;
      let leased = 0;
      for (const r of table.rows.values()) if (r.token !== null) leased++;
      most = Math.max(most, leased);
    }, 2);
    engine.startDispatching();
    engine.startFetching();
    try {
      await until(() => done === rows, "every row handled", 30_000);
    } finally {
      clearInterval(sampler);
      await engine.shutdown(1000);
    }
    // Ten 200 ms handlers start a row every 20 ms; a fetch of n rows takes 30n ms. Counted whole, that round
    // trip made the next fetch ask for 3n rows: the worker leased 90 of the 300 (on a busy machine). Counted
    // as a 1 MiB fetch's, it keeps about 4 beyond its 10 running handlers (24 at most seen on a busy machine).
    expect(most).toBeLessThanOrEqual(40);
  });
});
