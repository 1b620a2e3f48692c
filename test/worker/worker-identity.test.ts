import { hostname } from "node:os";
import { afterEach, beforeAll, describe, expect, it } from "vitest";
import { resolveWorkerOptions } from "../../src/worker/options.js";
import { type CliProcess, serviceEnv, startCli } from "../support/cli-process.js";
import { testDatabase } from "../support/database.js";
import { publisherFor, until } from "../support/worker.js";

/** A worker's name in acquired_by and its logs is readable and survives a restart of the same replica. */
const db = testDatabase("ident");
const outbox = publisherFor(db.schema);
const running: CliProcess[] = [];

beforeAll(() => db.migrate());
afterEach(() => {
  for (const p of running.splice(0)) if (p.child.exitCode === null) p.child.kill("SIGKILL");
});

/** Runs the service on the slow fixture queue and returns acquired_by of the row it leases. */
async function leasedBy(env: Record<string, string | undefined>): Promise<string> {
  const p = startCli(["run", "--handlers", "test/support/fixtures/handlers.ts"], serviceEnv(db, env));
  running.push(p);
  await p.waitFor("outbox-worker running");
  const [id] = await db.inTransaction((c) => outbox.publishMany(c, "slow", [{ payload: {} }]));
  await p.waitFor("slow handler started");
  const { rows } = await db.pool.query(`SELECT acquired_by FROM ${db.names.messages} WHERE id = $1`, [id]);
  p.child.kill("SIGTERM");
  await p.exited;
  await until(
    async () => (await db.pool.query(`SELECT count(*)::int AS n FROM ${db.names.messages}`)).rows[0].n === 0,
    "the slow row finished",
  );
  return rows[0]?.acquired_by;
}

describe("worker identity", () => {
  it("defaults to the host name, the same on every start of the replica", async () => {
    expect(await leasedBy({})).toBe(hostname());
    expect(await leasedBy({})).toBe(hostname());
  });

  it("is set by OUTBOX_WORKER_ID", async () => {
    expect(await leasedBy({ OUTBOX_WORKER_ID: "replica-a" })).toBe("replica-a");
  });

  it("gives a second worker of one process its own name", () => {
    const options = { connection: db.url, queues: { q: () => {} } };
    const a = resolveWorkerOptions(options).workerId;
    const b = resolveWorkerOptions(options).workerId;
    expect(a).not.toBe(b);
    for (const id of [a, b]) expect(id.startsWith(hostname())).toBe(true);
  });
});
