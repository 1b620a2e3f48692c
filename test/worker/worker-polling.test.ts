import { afterEach, beforeAll, describe, expect, it } from "vitest";
import type { WorkerOptions } from "../../src/worker/options.js";
import { CountingPool } from "../support/counting-pool.js";
import { testDatabase } from "../support/database.js";
import { until, workerFactory } from "../support/worker.js";

// Empty polls back off towards maxPollIntervalMs only while LISTEN delivers wake-ups; without them
// (listen off, poll-only behind a pooler, listener down) every poll comes at minPollIntervalMs, which is then
// the pickup latency. Counted on the worker's own pool: the lease statements it sends while a reference
// worker that cannot back off (its min and max interval are equal) sends a given number of its own. Both
// slow down together on a busy machine, so the count does not depend on its load, as one in a fixed
// second would.

const db = testDatabase("polling");
const workers = workerFactory(db);
beforeAll(() => db.migrate());

const pools: CountingPool[] = [];
afterEach(async () => {
  await Promise.all(pools.splice(0).map((p) => p.end()));
});

/** An idle worker on a pool of its own; start() resolves once its listener settled. */
async function countingWorker(options: Partial<WorkerOptions>): Promise<CountingPool> {
  const pool = new CountingPool({ connectionString: db.url, max: 6 });
  pools.push(pool);
  await workers.start({ connection: pool, minPollIntervalMs: 20, queues: { idle: () => {} }, ...options });
  return pool;
}

const TICKS = 50;

/** The subject's polls while the reference makes TICKS polls at 20 ms (jittered 16–20 ms). */
async function pollsPerReference(subject: Partial<WorkerOptions>): Promise<number> {
  const reference = await countingWorker({ listen: false, maxPollIntervalMs: 20 });
  // A maximum of an hour: any backing off at all shows as a handful of polls against the reference's TICKS.
  const worker = await countingWorker({ maxPollIntervalMs: 3_600_000, ...subject });
  const from = { reference: reference.leases, worker: worker.leases };
  await until(() => reference.leases - from.reference >= TICKS, `${TICKS} polls of the reference`, 60_000);
  return worker.leases - from.worker;
}

describe("idle polling", () => {
  it("without wake-ups an idle worker keeps polling at minPollIntervalMs", async () => {
    // As often as the reference (about TICKS); backing off by doubling would be about log2 of the window.
    expect(await pollsPerReference({ listen: false })).toBeGreaterThanOrEqual(TICKS / 2);
  });

  it("while the LISTEN connection cannot connect (reconnecting), an idle worker keeps polling at minPollIntervalMs", async () => {
    const refused = new URL(db.url);
    refused.port = "1";
    expect(
      await pollsPerReference({ listen: true, listenConnection: refused.toString() }),
    ).toBeGreaterThanOrEqual(TICKS / 2);
  });

  it("with LISTEN delivering wake-ups an idle worker backs off towards maxPollIntervalMs", async () => {
    // 20, 40, 80 … ms: under TICKS / 4 polls unless the reference's TICKS polls took over two minutes.
    expect(await pollsPerReference({ listen: true })).toBeLessThan(TICKS / 4);
  });
});
