import { chmod, mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import pg from "pg";
import { afterAll, afterEach, describe, expect, it } from "vitest";
import { createPublisher } from "../../src/produce/publisher.js";
import { type CliProcess, startCli } from "../support/cli-process.js";
import { until } from "../support/worker.js";

/** Zero-setup runs (no DATABASE_URL) in one folder: a live run's embedded server is never stopped by another. */
const HANDLERS = path.resolve("test/support/fixtures/handlers.ts");
const running: CliProcess[] = [];
const dirs: string[] = [];

afterEach(() => {
  for (const p of running.splice(0)) if (p.child.exitCode === null) p.child.kill("SIGKILL");
});
afterAll(async () => {
  for (const d of dirs) await rm(d, { recursive: true, force: true });
});

async function tempDir(): Promise<string> {
  const dir = await mkdtemp(path.join(tmpdir(), "outbox-owner-"));
  await chmod(dir, 0o755); // as root, the embedded server runs as "postgres" and must reach it
  dirs.push(dir);
  return dir;
}

function cli(args: string[], dir: string): CliProcess {
  const p = startCli(
    args,
    {
      DATABASE_URL: undefined,
      OUTBOX_SCHEMA: undefined,
      OUTBOX_DATA_DIR: path.join(dir, "data"),
      OUTBOX_LOG_PRETTY: "false",
      OUTBOX_MIN_POLL_INTERVAL_MS: "20",
      OUTBOX_MAX_POLL_INTERVAL_MS: "200",
    },
    dir,
  );
  running.push(p);
  return p;
}

describe("zero-setup runs side by side", () => {
  // Each starts an embedded server (initdb included): minutes on a busy machine.
  it("a second run refuses with a clear line and the first keeps its database and delivers", {
    timeout: 300_000,
  }, async () => {
    const dir = await tempDir();
    const first = cli(["run", "--handlers", HANDLERS], dir);
    await first.waitFor("outbox-worker running", 120_000);

    // It refuses up front: it neither waits for the folder nor stops the first run's server.
    const second = cli(["run", "--handlers", HANDLERS], dir);
    const { code } = await second.exited;
    expect(code).toBe(1);
    expect(second.output()).toContain("belongs to another run that is still going");
    expect(second.output()).not.toContain("stopping a Postgres left running");

    // The first run's server still answers and its worker still delivers.
    const data = path.join(dir, "data");
    const password = (await readFile(path.join(data, ".outbox-password"), "utf8")).trim();
    const port = Number((await readFile(path.join(data, "postmaster.pid"), "utf8")).split("\n")[3]);
    const pool = new pg.Pool({
      connectionString: `postgres://postgres:${password}@127.0.0.1:${port}/postgres`,
    });
    // pool.end() resolves before its clients' sockets are closed; the server is stopped right after, and a
    // client still closing gets its "terminating connection" message, which the pool re-emits as "error".
    pool.on("error", () => {});
    try {
      const client = await pool.connect();
      try {
        await createPublisher().publish(client, "fast", {});
      } finally {
        client.release();
      }
      await until(
        async () => (await pool.query("SELECT count(*)::int AS n FROM outbox.messages")).rows[0].n === 0,
        "the first run delivers after the second one left",
      );
    } finally {
      await pool.end();
    }
    first.child.kill("SIGTERM");
    expect((await first.exited).code).toBe(0);
  });

  it("Ctrl-C during the demo's live phase ends it cleanly, without a stack trace", {
    timeout: 300_000,
  }, async () => {
    const dir = await tempDir();
    const demo = cli(["demo", "--live", "60", "--data-dir", path.join(dir, "data")], dir);
    await demo.waitFor("Live for", 120_000);
    // Its first progress line: "1 s", or "2 s" when the machine is busy and the tick runs late.
    await demo.waitFor(" s  placed");
    demo.child.kill("SIGINT");
    const { code } = await demo.exited;
    expect(code).toBe(130);
    const out = demo.output();
    expect(out).toContain("Demo stopped.");
    expect(out).not.toMatch(/\n\s+at |Error:|Node\.js v/);
  });
});
