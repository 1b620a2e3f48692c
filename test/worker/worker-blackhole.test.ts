import path from "node:path";
import pino from "pino";
import { afterEach, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { serviceConfigSchema } from "../../src/service/config.js";
import { startService } from "../../src/service/service.js";
import { testDatabase } from "../support/database.js";
import { startPostgresProxy, type TcpProxy, throughProxy } from "../support/tcp-proxy.js";
import { publisherFor, until, workerFactory } from "../support/worker.js";

/**
 * DESIGN §4.8: a network that silently drops the worker's connections (no FIN, no RST: a failed NAT, a
 * failover that black-holes sockets) must not wedge it. Every round trip is bounded, a timed-out
 * connection is destroyed, and the worker carries on on fresh ones.
 */
const db = testDatabase("bhole");
const workers = workerFactory(db);
const outbox = publisherFor(db.schema);
let proxy: TcpProxy;

beforeAll(() => db.migrate());
beforeEach(async () => {
  await db.pool.query(`TRUNCATE ${db.names.messages}, ${db.names.deadLetters}`);
  proxy = await startPostgresProxy(db.url);
});
afterEach(async () => {
  await proxy.close();
});

function viaProxy(): string {
  return throughProxy(db.url, proxy);
}

async function publish(queue: string, n: number): Promise<string[]> {
  return db.inTransaction((c) =>
    outbox.publishMany(
      c,
      queue,
      Array.from({ length: n }, (_, i) => ({ payload: { i } })),
    ),
  );
}

async function remaining(): Promise<number> {
  return (await db.pool.query(`SELECT count(*)::int AS n FROM ${db.names.messages}`)).rows[0].n;
}

describe("half-open connections", () => {
  it("the worker resumes acking on fresh connections after its connections are black-holed: nothing lost, duplicates at most the rows it held", async () => {
    const ids = await publish("bh", 400);
    const ledger: string[] = [];
    const batchSize = 20;
    const concurrency = 4;
    const worker = await workers.start({
      connection: viaProxy(),
      concurrency,
      batchSize,
      leaseTtlMs: 3000, // so queryTimeoutMs defaults to 1000
      loopBackoffBaseMs: 20,
      loopBackoffMaxMs: 200,
      maxConsecutiveFailures: 10_000,
      queues: {
        bh: async (_p, m) => {
          ledger.push(m.id);
          await new Promise((r) => setTimeout(r, 5));
        },
      },
    });
    let acked = 0;
    worker.on("acked", () => void acked++);
    await until(() => acked >= 40, "some rows acked before the black-hole");

    proxy.freezeOpen();
    const accepted = proxy.accepted;
    // A stuck statement ends after queryTimeoutMs (1 s here) and its connection is destroyed; the pool may
    // hand out a few more stuck ones before fresh ones, each ending the same way. Without bounded round
    // trips the frozen connections would hold the worker for good: it resumes at all only on fresh ones.
    await until(async () => (await remaining()) === 0, "every row acked after the black-hole", 60_000);
    expect(proxy.accepted).toBeGreaterThan(accepted);
    const unique = new Set(ledger);
    expect(unique.size).toBe(ids.length);
    // A redelivered row is one whose ack was lost with a frozen connection: at most what the worker held.
    expect(ledger.length - unique.size).toBeLessThanOrEqual(2 * Math.max(batchSize, concurrency));
    const { rows } = await db.pool.query(`SELECT count(*)::int AS n FROM ${db.names.deadLetters}`);
    expect(rows[0].n).toBe(0);
  });

  it("stop() returns within its timeout while a statement is stuck on a black-holed connection", async () => {
    await publish("stuck", 20);
    const worker = await workers.start({
      connection: viaProxy(),
      leaseTtlMs: 7_200_000,
      // An hour: a stop() that waited for the stuck statement would not return within the test.
      queryTimeoutMs: 3_600_000,
      queues: { stuck: () => {} },
    });
    // Drained and idle: from now on the worker only polls, on its pooled (soon black-holed) connections.
    await until(async () => (await remaining()) === 0, "the worker drained the rows");
    proxy.freezeOpen();
    await until(() => proxy.swallowed > 0, "a poll's lease statement went into the black hole");
    // timeoutMs for handlers, plus at most a second for the last writes; the stuck fetch is not waited for.
    await worker.stop({ timeoutMs: 1000 });
    expect(worker.held).toBe(0);
  });

  it("while outcome writes fail, the heartbeat does not keep alive the leases of rows waiting for them", async () => {
    // A worker role that may lease and renew (UPDATE) but not ack (DELETE): its acks fail for as long as
    // the test wants, whatever happens to the rows meanwhile.
    const role = `${db.schema}_noack`;
    // A password, whether the server trusts local users or asks them for one.
    await db.pool.query(`CREATE ROLE "${role}" LOGIN PASSWORD 'noack-pw'`);
    await db.pool.query(`GRANT USAGE ON SCHEMA "${db.schema}" TO "${role}"`);
    await db.pool.query(`GRANT SELECT, INSERT, UPDATE ON ${db.names.messages} TO "${role}"`);
    await db.pool.query(`GRANT SELECT, INSERT, UPDATE ON ${db.names.deadLetters} TO "${role}"`);
    const asRole = new URL(db.url);
    asRole.username = role;
    asRole.password = "noack-pw";
    try {
      const [first, second] = await publish("stall", 2);
      let finishSecond!: () => void;
      const secondMayFinish = new Promise<void>((resolve) => {
        finishSecond = resolve;
      });
      const worker = await workers.start({
        connection: asRole.toString(),
        concurrency: 2,
        leaseTtlMs: 1500,
        heartbeatMs: 300,
        loopBackoffBaseMs: 100,
        loopBackoffMaxMs: 200,
        maxConsecutiveFailures: 10_000,
        queues: { stall: async (_p, m) => (m.id === second ? secondMayFinish : undefined) },
      });
      const completeErrors: number[] = [];
      worker.on("loop_error", (e) => {
        if (e.loop === "complete") completeErrors.push(e.consecutive);
      });
      // The first ack fails and keeps failing; the second outcome then waits behind it, unwritten.
      await until(() => completeErrors.length >= 1, "the first ack fails");
      expect(first).toBeDefined();
      finishSecond();
      // Renewed every 300 ms, the second row's first lease would never run out; left alone it does within
      // the 1.5 s TTL (and the row may then be leased again: that is the point).
      await until(
        async () =>
          (
            await db.pool.query(
              `SELECT count(*)::int AS n FROM ${db.names.messages}
               WHERE id = $1 AND deliveries_count = 1 AND lease_expires_at > now()`,
              [second],
            )
          ).rows[0].n === 0,
        "the waiting row's lease runs out",
        60_000,
      );
      await db.pool.query(`GRANT DELETE ON ${db.names.messages} TO "${role}"`);
      // Writes work again: everything ends acked (a row leased again meanwhile is delivered again; none lost).
      await until(async () => (await remaining()) === 0, "both rows acked once acks are allowed", 60_000);
      await worker.stop({ timeoutMs: 2000 });
    } finally {
      await db.pool.query(`DROP OWNED BY "${role}"`);
      await db.pool.query(`DROP ROLE "${role}"`);
    }
  });
  it("the service's readiness and metrics queries on black-holed connections do not starve the worker of its pool", async () => {
    const config = serviceConfigSchema.parse({
      databaseUrl: viaProxy(),
      schema: db.schema,
      handlers: path.resolve("test/support/fixtures/handlers.ts"),
      worker: { leaseTtlMs: 3000, minPollIntervalMs: 20, maxPollIntervalMs: 200 },
      http: { port: 0, host: "127.0.0.1", gaugeIntervalMs: 100 },
      log: { level: "silent" },
    });
    const service = await startService(config, pino({ level: "silent" }));
    try {
      await publish("fast", 20);
      await until(async () => (await remaining()) === 0, "rows delivered before the black-hole");
      proxy.freezeOpen();
      // Each probe runs its checks on pooled connections; stuck ones would keep their pool client for good.
      for (let i = 0; i < 6; i++) {
        const res = await fetch(`http://127.0.0.1:${service.httpPort}/readyz`);
        await res.body?.cancel();
      }
      await publish("fast", 20);
      await until(async () => (await remaining()) === 0, "rows delivered after the black-hole", 60_000);
    } finally {
      await service.stop();
    }
  });
});
