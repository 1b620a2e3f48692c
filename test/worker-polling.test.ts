import pg from "pg";
import { afterEach, beforeAll, describe, expect, it } from "vitest";
import { testDatabase } from "./helpers/database.js";
import { workerFactory } from "./helpers/worker.js";

// Empty polls back off towards maxPollIntervalMs only while LISTEN delivers wake-ups; without them
// (listen off, poll-only behind a pooler, listener down) every poll comes at minPollIntervalMs, which is then
// the pickup latency. Counted on the worker's own pool: the lease statements it sends in an idle second.

const db = testDatabase("polling");
const workers = workerFactory(db);
beforeAll(() => db.migrate());

/** A pool that counts the lease statements (the fetch) sent through it. */
class CountingPool extends pg.Pool {
  leases = 0;
  // biome-ignore lint/suspicious/noExplicitAny: pg's query has many overloads; this only looks at the text.
  override query(config: any, ...rest: any[]): any {
    if (typeof config === "object" && /FOR UPDATE SKIP LOCKED/.test(String(config?.text))) this.leases++;
    return (super.query as (...args: unknown[]) => unknown)(config, ...rest);
  }
}

const pools: CountingPool[] = [];
afterEach(async () => {
  await Promise.all(pools.splice(0).map((p) => p.end()));
});

async function idlePolls(listen: boolean, listenConnection?: string): Promise<number> {
  const pool = new CountingPool({ connectionString: db.url, max: 6 });
  pools.push(pool);
  // start() resolves once the listener settled: listening here (the database delivers notifications).
  await workers.start({
    connection: pool,
    listen,
    ...(listenConnection === undefined ? {} : { listenConnection }),
    minPollIntervalMs: 20,
    maxPollIntervalMs: 1000,
    queues: { idle: () => {} },
  });
  const before = pool.leases;
  // An observation window, not a sync point: how often an idle worker polls in one second.
  await new Promise((resolve) => setTimeout(resolve, 1000));
  return pool.leases - before;
}

describe("idle polling", () => {
  it("without wake-ups an idle worker keeps polling at minPollIntervalMs", async () => {
    // 20 ms (jittered 16–20 ms): about 50 polls a second; backing off towards 1 s would be a handful.
    expect(await idlePolls(false)).toBeGreaterThanOrEqual(25);
  });

  it("while the LISTEN connection cannot connect (reconnecting), an idle worker keeps polling at minPollIntervalMs", async () => {
    const refused = new URL(db.url);
    refused.port = "1";
    expect(await idlePolls(true, refused.toString())).toBeGreaterThanOrEqual(25);
  });

  it("with LISTEN delivering wake-ups an idle worker backs off towards maxPollIntervalMs", async () => {
    expect(await idlePolls(true)).toBeLessThanOrEqual(10);
  });
});
