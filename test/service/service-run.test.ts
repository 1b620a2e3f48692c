import { chmod, mkdtemp, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { startEmbeddedPostgres } from "../../src/embedded/embedded-postgres.js";
import { type CliProcess, serviceEnv, startCli } from "../support/cli-process.js";
import { testDatabase } from "../support/database.js";
import { removeTempDir } from "../support/remove-temp-dir.js";
import { startPostgresProxy, throughProxy } from "../support/tcp-proxy.js";
import { publisherFor, until } from "../support/worker.js";

const db = testDatabase("svc");
const outbox = publisherFor(db.schema);
const HANDLERS = path.resolve("test/support/fixtures/handlers.ts");
const running: CliProcess[] = [];
const dirs: string[] = [];

beforeAll(() => db.migrate());
afterEach(() => {
  for (const p of running.splice(0)) if (p.child.exitCode === null) p.child.kill("SIGKILL");
});
// Also stops an embedded Postgres a killed `run` left on its data folder (a zero-setup test that failed).
afterAll(async () => {
  for (const d of dirs) await removeTempDir(d);
});

function run(args: string[], env: Record<string, string | undefined> = {}, cwd?: string): CliProcess {
  const p = startCli(["run", ...args], serviceEnv(db, env), cwd);
  running.push(p);
  return p;
}

async function remaining(queue: string): Promise<number> {
  const { rows } = await db.pool.query(
    `SELECT count(*)::int AS n FROM ${db.names.messages} WHERE queue = $1`,
    [queue],
  );
  return rows[0].n;
}

async function publish(queue: string, n: number) {
  await db.inTransaction((c) =>
    outbox.publishMany(
      c,
      queue,
      Array.from({ length: n }, (_, i) => ({ payload: { i } })),
    ),
  );
}

async function tempDir(): Promise<string> {
  const dir = await mkdtemp(path.join(tmpdir(), "outbox-run-"));
  await chmod(dir, 0o755); // as root, an embedded server runs as "postgres" and must reach it
  dirs.push(dir);
  return dir;
}

describe("outbox-worker run", () => {
  it("serves a handlers module with metrics, then stops on SIGTERM with exit 0", async () => {
    const p = run(["--handlers", HANDLERS, "--http-port", "0"]);
    const listening = JSON.parse(await p.waitFor("http server listening"));
    await p.waitFor("outbox-worker running");
    await publish("fast", 25);
    await until(async () => (await remaining("fast")) === 0, "rows delivered");
    const base = `http://127.0.0.1:${listening.port}`;
    expect((await fetch(`${base}/healthz`)).status).toBe(200);
    const metrics = await (await fetch(`${base}/metrics`)).text();
    expect(metrics).toMatch(/outbox_acked_total\{queue="fast"\} 25/);
    p.child.kill("SIGTERM");
    expect(await p.exited).toEqual({ code: 0, signal: null });
    expect(p.output()).toContain("worker stopped");
    // JSON logs, one object per line.
    for (const line of p.output().trim().split("\n")) expect(() => JSON.parse(line)).not.toThrow();
  });

  it("SIGTERM lets a running handler finish and its row is acknowledged", async () => {
    const p = run(["--handlers", HANDLERS]);
    await p.waitFor("outbox-worker running");
    await publish("slow", 1);
    await p.waitFor("slow handler started");
    p.child.kill("SIGTERM");
    expect((await p.exited).code).toBe(0);
    expect(await remaining("slow")).toBe(0);
  });

  it("a second signal exits at once, non-zero; the lease is left to expire", async () => {
    const p = run(["--handlers", HANDLERS], { OUTBOX_STOP_TIMEOUT_MS: "60000" });
    await p.waitFor("outbox-worker running");
    await publish("hang", 1);
    await p.waitFor("hang handler started");
    p.child.kill("SIGTERM");
    await p.waitFor("stopping gracefully");
    p.child.kill("SIGTERM");
    expect((await p.exited).code).toBe(143);
    expect(p.output()).toContain("second signal");
    await db.pool.query(`DELETE FROM ${db.names.messages} WHERE queue = 'hang'`);
  });

  it("exits 1 with the reason after a run of database failures once it runs", async () => {
    // A good start, then the database goes away: the worker's loops give up (a bad start fails earlier:
    // test/service/service-startup.test.ts).
    const proxy = await startPostgresProxy(db.url);
    try {
      const p = run(["--handlers", HANDLERS], {
        DATABASE_URL: throughProxy(db.url, proxy),
        OUTBOX_LISTEN: "false",
        OUTBOX_MAX_CONSECUTIVE_FAILURES: "2",
        OUTBOX_LOOP_BACKOFF_BASE_MS: "10",
        OUTBOX_LOOP_BACKOFF_MAX_MS: "20",
      });
      await p.waitFor("outbox-worker running");
      proxy.cut();
      expect((await p.exited).code).toBe(1);
      expect(p.output()).toMatch(/worker gave up: /);
    } finally {
      await proxy.close();
    }
  });

  it("refuses an invalid config with exit 2, naming every field and its variable, before connecting", async () => {
    const dir = await tempDir();
    const file = path.join(dir, "config.json");
    await writeFile(file, JSON.stringify({ worker: { concurency: 4 }, relays: { q: { type: "smtp" } } }));
    const p = run(["--config", file, "--handlers", HANDLERS], {
      DATABASE_URL: "postgres://nobody@127.0.0.1:1/none",
      OUTBOX_BATCH_SIZE: "ten",
      OUTBOX_LEASE_TTL_MS: "10000",
      OUTBOX_HEARTBEAT_MS: "9000",
      OUTBOX_LOG_LEVEL: "loud",
    });
    expect((await p.exited).code).toBe(2);
    const out = p.output();
    expect(out).toContain("invalid config");
    expect(out).toContain('worker.batchSize (OUTBOX_BATCH_SIZE): expected a whole number, got "ten"');
    expect(out).toContain(
      "worker.concurency: unknown field (did you mean worker.concurrency, OUTBOX_CONCURRENCY?)",
    );
    expect(out).toMatch(/relays\.q\.type \(OUTBOX_RELAYS\)/);
    expect(out).toMatch(/log\.level \(OUTBOX_LOG_LEVEL\)/);
    expect(out).not.toContain("ECONNREFUSED");
  });

  it("refuses to start with nothing to serve", async () => {
    const p = run([]);
    expect((await p.exited).code).toBe(2);
    expect(p.output()).toContain("nothing to serve");
  });
});

describe("no password in any output", () => {
  const canary = "Canary-pw-93f1";

  async function expectExitWithoutCanary(p: CliProcess, code: number) {
    const exit = await p.exited;
    expect(exit.code, p.output()).toBe(code);
    expect(p.output()).not.toContain(canary);
    expect(p.output()).not.toContain(encodeURIComponent(canary));
  }

  it("across startup and stop (password in the URL)", async () => {
    const url = new URL(db.url);
    const secret = url.password || canary;
    url.password = secret;
    const p = run(["--handlers", HANDLERS, "--log-level", "debug"], { DATABASE_URL: url.toString() });
    await p.waitFor("outbox-worker running");
    p.child.kill("SIGTERM");
    await p.exited;
    expect(p.output()).toContain("***");
    expect(p.output()).not.toContain(secret);
  });

  it("on an authentication failure (URL, ?password= and PGPASSWORD)", async () => {
    const dir = await tempDir();
    const server = await startEmbeddedPostgres({ dataDir: path.join(dir, "pg") });
    try {
      const base = new URL(server.url);
      const inUrl = new URL(base);
      inUrl.password = canary;
      const inQuery = new URL(base);
      inQuery.password = "";
      inQuery.searchParams.set("password", canary);
      const noPassword = new URL(base);
      noPassword.password = "";
      for (const [databaseUrl, pgpassword] of [
        [inUrl.toString(), undefined],
        [inQuery.toString(), undefined],
        [noPassword.toString(), canary],
      ]) {
        const p = run(["--handlers", HANDLERS, "--migrate"], {
          DATABASE_URL: databaseUrl,
          PGPASSWORD: pgpassword,
        });
        await expectExitWithoutCanary(p, 1);
        expect(p.output()).toMatch(/password authentication failed/);
      }
    } finally {
      await server.stop();
    }
  }, 300_000);

  it("on an unreachable host and on a bad config", async () => {
    const unreachable = run(["--handlers", HANDLERS], {
      DATABASE_URL: `postgres://app:${canary}@127.0.0.1:1/none?password=${canary}`,
      PGPASSWORD: canary,
      OUTBOX_STARTUP_WAIT_MS: "500",
      OUTBOX_LISTEN: "false",
      OUTBOX_MAX_CONSECUTIVE_FAILURES: "2",
      OUTBOX_LOOP_BACKOFF_BASE_MS: "10",
      OUTBOX_LOOP_BACKOFF_MAX_MS: "20",
      OUTBOX_LOG_LEVEL: "debug",
    });
    await expectExitWithoutCanary(unreachable, 1);
    const badConfig = run(["--handlers", HANDLERS], {
      DATABASE_URL: `postgres://app:${canary}@127.0.0.1:1/none`,
      OUTBOX_CONCURRENCY: "-3",
    });
    await expectExitWithoutCanary(badConfig, 2);
    expect(badConfig.output()).toContain("worker.concurrency (OUTBOX_CONCURRENCY)");
  });
});

describe("zero-setup run on the embedded Postgres", () => {
  it("starts its own Postgres, serves, and after a SIGKILL the next run takes over the left-over server", async () => {
    const dir = await tempDir();
    const env = {
      DATABASE_URL: undefined,
      OUTBOX_SCHEMA: undefined,
      OUTBOX_DATA_DIR: path.join(dir, "data"),
    };
    const first = run(["--handlers", HANDLERS], env, dir);
    await first.waitFor("outbox-worker running", 120_000);
    first.child.kill("SIGKILL");
    await first.exited;
    const second = run(["--handlers", HANDLERS], env, dir);
    await second.waitFor("outbox-worker running", 120_000);
    second.child.kill("SIGTERM");
    expect(await second.exited, second.output()).toEqual({ code: 0, signal: null });
    expect(second.output()).toContain("stopping a Postgres left running");
  }, 300_000);
});
