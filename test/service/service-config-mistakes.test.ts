import path from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { type CliProcess, startCli } from "../support/cli-process.js";

// Configuration mistakes end `outbox-worker run` with exit 2 and every problem listed, before anything
// connects. DATABASE_URL points at a closed port and the startup wait is off: any connection attempt would
// end the run with exit 1 and ECONNREFUSED instead, at once.
const CLOSED = "postgres://app@127.0.0.1:1/none";
const HANDLERS = path.resolve("test/support/fixtures/handlers.ts");
const running: CliProcess[] = [];

afterEach(() => {
  for (const p of running.splice(0)) if (p.child.exitCode === null) p.child.kill("SIGKILL");
});

async function refused(args: string[], env: Record<string, string>): Promise<string> {
  const p = startCli(["run", ...args], {
    DATABASE_URL: CLOSED,
    OUTBOX_STARTUP_WAIT_MS: "0",
    OUTBOX_LOG_PRETTY: "false",
    ...env,
  });
  running.push(p);
  const exit = await p.exited;
  const out = p.output();
  expect(exit.code, out).toBe(2);
  expect(out).toContain("outbox-worker run: invalid config:");
  expect(out).not.toMatch(/ECONNREFUSED|waiting for the database|could not start/);
  return out;
}

describe("outbox-worker run refuses configuration mistakes with exit 2, before connecting", () => {
  it("an unknown OUTBOX_ variable, naming the one probably meant", async () => {
    const out = await refused(["--handlers", HANDLERS], { OUTBOX_CONCURENCY: "4" });
    expect(out).toContain(
      "OUTBOX_CONCURENCY: unknown environment variable (did you mean OUTBOX_CONCURRENCY (worker.concurrency)?)",
    );
  });

  it("every wrong field at once, a bad log level among them", async () => {
    const out = await refused(["--handlers", HANDLERS, "--log-level", "loud"], {
      OUTBOX_SCHEMA: "Bad-Name",
      OUTBOX_LEASE_TTL_MS: "10000",
      OUTBOX_HEARTBEAT_MS: "6000",
    });
    expect(out).toMatch(/log\.level \(OUTBOX_LOG_LEVEL\): /);
    expect(out).toMatch(/schema \(OUTBOX_SCHEMA\): "Bad-Name" is not a plain identifier/);
    expect(out).toContain(
      "worker.heartbeatMs (OUTBOX_HEARTBEAT_MS): must be at most half of leaseTtlMs (10000), got 6000",
    );
  });

  it("a DATABASE_URL that is not a postgres:// URL, naming the form and never the password", async () => {
    const canary = "Canary-pw-51c7";
    for (const url of [
      `host=127.0.0.1 port=1 dbname=none password=${canary}`,
      `postgres://app:${canary}@127.0.0.1:abc/none`,
      `http://app:${canary}@127.0.0.1:1/none`,
    ]) {
      const out = await refused(["--handlers", HANDLERS], { DATABASE_URL: url });
      expect(out).toContain(
        "databaseUrl (DATABASE_URL): expected a URL like postgres://<user>:<password>@<host>:5432/<database>",
      );
      expect(out).not.toContain(canary);
    }
  });

  it("a handlers module with a bad queue name", async () => {
    const out = await refused(
      ["--handlers", path.resolve("test/support/fixtures/bad-queue-handlers.ts")],
      {},
    );
    expect(out).toMatch(
      /handlers \(OUTBOX_HANDLERS\): queue name in .*bad-queue-handlers\.ts: "bad name!" may only hold letters/,
    );
  });
});
