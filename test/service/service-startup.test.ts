import path from "node:path";
import { afterEach, beforeAll, describe, expect, it } from "vitest";
import { type CliProcess, serviceEnv, startCli } from "../support/cli-process.js";
import { testDatabase } from "../support/database.js";
import { memoryLogger } from "../support/memory-logger.js";
import { startPostgresProxy, throughProxy } from "../support/tcp-proxy.js";
import { publisherFor, until, workerFactory } from "../support/worker.js";

/**
 * `outbox-worker run` fails fast on a database no retry can make usable, waits (bounded) for one that is not
 * up yet, and says "running" only once it really runs. Run as a user would: the CLI in a child process.
 */
const db = testDatabase("start");
const workers = workerFactory(db);
const outbox = publisherFor(db.schema);
const HANDLERS = path.resolve("test/support/fixtures/handlers.ts");
const running: CliProcess[] = [];

beforeAll(() => db.migrate());
afterEach(() => {
  for (const p of running.splice(0)) if (p.child.exitCode === null) p.child.kill("SIGKILL");
});

function run(env: Record<string, string>): CliProcess {
  const p = startCli(["run", "--handlers", HANDLERS], serviceEnv(db, env));
  running.push(p);
  return p;
}

function withUrl(change: (url: URL) => void): string {
  const url = new URL(db.url);
  change(url);
  return url.toString();
}

/** Exit code and output of a run that must end by itself. */
async function failedStart(env: Record<string, string>) {
  const p = run(env);
  const { code } = await p.exited;
  return { code, output: p.output() };
}

/** A startup wait of an hour: a run that retried what no retry fixes would not end within the test. */
const WAIT_AN_HOUR = { OUTBOX_STARTUP_WAIT_MS: "3600000" };
const RETRYING = "waiting for the database to come up";

describe("outbox-worker run at start", () => {
  it("a database that does not exist: exit 1 at the first attempt, one line naming it, never 'running'", async () => {
    const r = await failedStart({
      ...WAIT_AN_HOUR,
      DATABASE_URL: withUrl((u) => {
        u.pathname = "/no_such_database_x";
      }),
    });
    expect(r.code).toBe(1);
    // It used to retry for minutes.
    expect(r.output).not.toContain(RETRYING);
    expect(r.output).toContain("outbox-worker run: cannot use the database: the database does not exist");
    expect(r.output).not.toContain("outbox-worker running");
  });

  it("a user the server refuses: exit 1 at the first attempt, naming the user as the thing to check", async () => {
    const r = await failedStart({
      ...WAIT_AN_HOUR,
      DATABASE_URL: withUrl((u) => {
        u.username = "no_such_role_x";
      }),
    });
    expect(r.code).toBe(1);
    expect(r.output).not.toContain(RETRYING);
    // Trust auth answers "no such role" (28000); password auth refuses the password first (28P01).
    expect(r.output).toMatch(
      /outbox-worker run: cannot use the database: (the server refused this user|authentication failed).*(28000|28P01)/,
    );
  });

  it("an unmigrated schema: exit 1 with the command that fixes it", async () => {
    const schema = db.freshSchema("unmig");
    const r = await failedStart({ DATABASE_URL: db.url, OUTBOX_SCHEMA: schema });
    expect(r.code).toBe(1);
    expect(r.output).toContain(
      `outbox-worker run: schema "${schema}" is not migrated: run \`outbox-worker migrate --schema ${schema}\``,
    );
    expect(r.output).not.toContain("outbox-worker running");
  });

  it("a user without the worker's privileges: exit 1 naming what is missing", async () => {
    const role = `${db.schema}_ro`;
    await db.pool.query(`CREATE ROLE "${role}" LOGIN PASSWORD 'ro-pw'`);
    try {
      await db.pool.query(`GRANT USAGE ON SCHEMA "${db.schema}" TO "${role}"`);
      await db.pool.query(`GRANT SELECT ON ALL TABLES IN SCHEMA "${db.schema}" TO "${role}"`);
      const r = await failedStart({
        DATABASE_URL: withUrl((u) => {
          u.username = role;
          u.password = "ro-pw";
        }),
      });
      expect(r.code).toBe(1);
      expect(r.output).toMatch(
        new RegExp(
          `permission denied: the worker's user \\(${role}\\) needs UPDATE \\(acquired_token, [a-z_, ]+\\) ON .*messages`,
        ),
      );
      expect(r.output).toContain(`run \`outbox-worker grant --worker ${role} --schema ${db.schema}\``);
      expect(r.output).not.toContain("ro-pw");
    } finally {
      await db.pool.query(`DROP OWNED BY "${role}"`);
      await db.pool.query(`DROP ROLE "${role}"`);
    }
  });

  it("a database that is not up yet is waited for with a progress line, then the service runs", async () => {
    const proxy = await startPostgresProxy(db.url);
    try {
      proxy.cut(); // connections are refused until restore()
      const p = run({ DATABASE_URL: throughProxy(db.url, proxy), ...WAIT_AN_HOUR });
      await p.waitFor("waiting for the database to come up");
      expect(p.output()).not.toContain("outbox-worker running");
      proxy.restore();
      await p.waitFor("outbox-worker running");
      await db.inTransaction((c) => outbox.publish(c, "fast", {}));
      await until(
        async () =>
          (await db.pool.query(`SELECT count(*)::int AS n FROM ${db.names.messages}`)).rows[0].n === 0,
        "the row delivered",
      );
      p.child.kill("SIGTERM");
      expect((await p.exited).code).toBe(0);
    } finally {
      await proxy.close();
    }
  });

  it("past the startup wait: exit 1 naming the setting", async () => {
    const r = await failedStart({
      DATABASE_URL: withUrl((u) => {
        u.port = "1";
      }),
      OUTBOX_STARTUP_WAIT_MS: "1000",
    });
    expect(r.code).toBe(1);
    expect(r.output).toContain("waiting for the database to come up");
    expect(r.output).toContain(
      "did not answer within the startup wait of 1000 ms (startupWaitMs, OUTBOX_STARTUP_WAIT_MS)",
    );
  });
});

describe("failed deliveries", () => {
  it("show at the default log level: one warn line per queue per interval, with the last error", async () => {
    const { lines, logger } = memoryLogger();
    await db.inTransaction((c) =>
      outbox.publishMany(
        c,
        "flaky",
        Array.from({ length: 3 }, (_, i) => ({ payload: { i } })),
      ),
    );
    const worker = await workers.start({
      logger,
      queues: {
        flaky: async () => {
          throw new Error("downstream answered 503");
        },
      },
    });
    const retried: string[] = [];
    worker.on("retried", (e) => retried.push(e.id));
    await until(() => retried.length === 3, "three failed deliveries");
    const warnings = lines.filter((l) => l.level === 40 && l.msg.startsWith("deliveries failing"));
    expect(warnings).toHaveLength(1);
    expect(warnings[0]).toMatchObject({
      queue: "flaky",
      error: expect.stringContaining("downstream answered 503"),
    });
  });
});
