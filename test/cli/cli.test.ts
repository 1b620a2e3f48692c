import { chmod, mkdtemp } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { runCli } from "../support/cli-in-process.js";
import { execCli } from "../support/cli-process.js";
import { testDatabase } from "../support/database.js";
import { LATEST_VERSION } from "../support/migrations.js";
import { removeTempDir } from "../support/remove-temp-dir.js";

const db = testDatabase("cli");

/** Run the CLI as a user would, in-process (main(argv, io): the binary's output and exit code). */
function cli(args: string[], env: Record<string, string | undefined> = {}) {
  return runCli(args, { ...process.env, DATABASE_URL: undefined, ...env });
}

/** The demo owns its process (signals, exit): the built CLI in a child process; never throws on a non-zero exit. */
function demo(args: string[], env: Record<string, string | undefined> = {}) {
  return execCli(["demo", ...args], env, { timeoutMs: 120_000 });
}

/**
 * The test database URL with a password that must never be printed: its own (embedded Postgres uses a
 * random one), or a canary spliced in where the server trusts connections and ignores it.
 */
function withSecret(url: string): { url: string; secret: string } {
  const u = new URL(url);
  if (u.password) return { url, secret: decodeURIComponent(u.password) };
  u.password = "canary-Secr3t";
  return { url: u.toString(), secret: "canary-Secr3t" };
}

describe("outbox-worker CLI", () => {
  it("migrate creates the schema, then reports it up to date, never printing the password", async () => {
    const schema = db.freshSchema("m");
    const { url, secret } = withSecret(db.url);
    const first = await cli(["migrate", "--schema", schema], { DATABASE_URL: url });
    expect(first.code).toBe(0);
    expect(first.stdout).toContain(`schema "${schema}" migrated to version ${LATEST_VERSION}`);
    const second = await cli(["migrate", "--schema", schema, "--database-url", url]);
    expect(second.stdout).toContain(`schema "${schema}" is up to date (version ${LATEST_VERSION})`);
    // The function files once, on the first run only (their checksums are recorded).
    expect(first.stdout).toMatch(/^applied function files: ack_key_heads, .*topic_queues$/m);
    expect(second.stdout).not.toContain("applied function files");
    for (const out of [first, second]) expect(out.stdout + out.stderr).not.toContain(secret);
  });

  it("migrate --print writes SQL without touching a database", async () => {
    const out = await cli(["migrate", "--print", "--schema", "printed_one"]);
    expect(out.code).toBe(0);
    expect(out.stdout).toContain('CREATE TABLE "printed_one".messages');
    expect(out.stdout).toContain('INSERT INTO "printed_one".schema_migrations');
  });

  it("rejects a hostile schema name with exit 2 before connecting", async () => {
    const out = await cli(["migrate", "--schema", 'x"; drop table t;--'], {
      DATABASE_URL: "postgres://u:canary-pw@127.0.0.1:1/none",
    });
    expect(out.code).toBe(2);
    expect(out.stderr).toContain("invalid schema");
    expect(out.stderr).not.toContain("ECONNREFUSED");
  });

  it("fails with exit 1 and a redacted message when the database is unreachable", async () => {
    const out = await cli(["migrate", "--schema", "x_unreachable"], {
      DATABASE_URL: "postgres://app:canary-pw2@127.0.0.1:1/none?password=canary-pw2",
      PGPASSWORD: "canary-pw3",
    });
    expect(out.code).toBe(1);
    expect(out.stderr).toMatch(/ECONNREFUSED/);
    expect(out.stdout + out.stderr).not.toMatch(/canary-pw/);
  });

  it("explains a missing database and unknown commands with exit 2", async () => {
    const missing = await cli(["migrate"]);
    expect(missing.code).toBe(2);
    expect(missing.stderr).toContain("set DATABASE_URL");
    const unknown = await cli(["frobnicate"]);
    expect(unknown.code).toBe(2);
    expect(unknown.stderr).toContain('unknown command "frobnicate"');
    const help = await cli(["migrate", "--help"]);
    expect(help.code).toBe(0);
    expect(help.stdout).toContain("Usage: outbox-worker migrate");
  });

  it("says what is wrong with a flag in one line of its own, balanced quotes, then the usage", async () => {
    const { runUsage } = await import("../../src/cli/run-command.js");
    const run = await cli(["run", "--nosuchflag"]);
    expect(run.code).toBe(2);
    expect(run.stderr).toBe(`outbox-worker run: unknown option "--nosuchflag"\n\n${runUsage}\n`);
    // Every kind of flag mistake, in the commands' own parser and in replay's (which takes --id twice).
    const cases: [string[], string][] = [
      [["run", "-x"], 'outbox-worker run: unknown option "-x"'],
      [
        ["run", "--handler", "h.js"],
        'outbox-worker run: unknown option "--handler" (did you mean --handlers?)',
      ],
      [["run", "--schema"], "outbox-worker run: --schema needs a value"],
      [["run", "--migrate=yes"], 'outbox-worker run: --migrate takes no value, got "--migrate=yes"'],
      [
        ["run", "--schema", "--migrate"],
        'outbox-worker run: --schema needs a value, got the option "--migrate" (if that is the value, write --schema=--migrate)',
      ],
      [["status", "--jsno"], 'outbox-worker status: unknown option "--jsno" (did you mean --json?)'],
      [
        ["dead-letters", "replay", "--id", "1", "--ids", "2"],
        'outbox-worker dead-letters: unknown option "--ids" (did you mean --id?)',
      ],
      [["dead-letters", "replay", "--id"], "outbox-worker dead-letters: --id needs a value"],
    ];
    for (const [args, line] of cases) {
      const out = await cli(args);
      expect(out.code, args.join(" ")).toBe(2);
      expect(out.stderr.split("\n")[0]).toBe(line);
      expect(out.stderr).toContain(`\n\nUsage: outbox-worker ${args[0]}`);
    }
  });

  it("trigger enable/status/disable", async () => {
    const schema = db.freshSchema("trg");
    await cli(["migrate", "--schema", schema], { DATABASE_URL: db.url });
    const env = { DATABASE_URL: db.url };
    expect((await cli(["trigger", "status", "--schema", schema], env)).stdout).toContain("disabled");
    expect((await cli(["trigger", "enable", "--schema", schema], env)).code).toBe(0);
    expect((await cli(["trigger", "status", "--schema", schema], env)).stdout).toContain("enabled");
    expect((await cli(["trigger", "disable", "--schema", schema], env)).code).toBe(0);
    expect((await cli(["trigger", "status", "--schema", schema], env)).stdout).toContain("disabled");
    expect((await cli(["trigger", "sideways", "--schema", schema], env)).code).toBe(2);
  });

  describe("demo", () => {
    const dirs: string[] = [];
    afterAll(async () => {
      // Also stops the embedded Postgres of a demo that timed out (exec kills it, not its server).
      for (const d of dirs) await removeTempDir(d);
    });

    it("places orders on an existing database: committed ones have a message, rolled-back ones none", async () => {
      const schema = db.freshSchema("demo");
      // demo_orders is created on the search path: in the fresh schema (dropped after the file), not public.
      const url = new URL(db.url);
      url.searchParams.set("options", `-c search_path=${schema}`);
      const out = await demo(["--orders", "10", "--live", "1"], {
        DATABASE_URL: url.toString(),
        OUTBOX_SCHEMA: schema,
      });
      expect(out.code).toBe(0);
      // It says what it leaves in someone else's database.
      expect(out.stdout).toContain(
        `Creating table ${schema}.demo_orders for the demo's orders (it stays; DROP TABLE demo_orders removes it)`,
      );
      // Each order publishes once to the topic order.placed; two queues subscribe to it, and it says so.
      expect(out.stdout).toContain(
        "Topic order.placed: order.placed subscribes to order.placed, email.receipts subscribes to order.*; an order's event reaches email.receipts, order.placed (the subscriptions stay;",
      );
      expect(out.stdout).toContain(
        "9 committed (order + a message for each subscriber), 1 rolled back (neither)",
      );
      expect(out.stdout).toMatch(
        /Delivered 18 message\(s\) \(order\.placed 9, email\.receipts 9\) in \d+ ms; 0 left in the outbox/,
      );
      // Both subscribers got each committed order: one delivery line each.
      for (const queue of ["order.placed", "email.receipts"]) {
        const orders = [
          ...out.stdout.matchAll(new RegExp(`delivered message \\d+ to ${queue}: \\D+ (\\d+) for`, "g")),
        ];
        expect(
          orders.map((m) => Number(m[1])).sort((a, b) => a - b),
          queue,
        ).toEqual([1, 2, 3, 4, 5, 6, 7, 8, 9]);
      }
      expect(out.stdout).toContain("receipt of order 1 for customer-2 (topic order.placed)");
      // The live phase: every committed order delivered to both subscribers, none of the rolled-back ones.
      const live =
        /Live: placed (\d+), rolled back (\d+), delivered (\d+) message\(s\) of (\d+) to 2 subscribers/.exec(
          out.stdout,
        );
      expect(live).not.toBeNull();
      const [placed, rolledBack, delivered, copies] = (live ?? []).slice(1).map(Number);
      expect(copies).toBe(2 * ((placed ?? 0) - (rolledBack ?? 0)));
      expect(delivered).toBe(copies);
      const { rows } = await db.pool.query(`SELECT count(*)::int AS n FROM "${schema}".messages`);
      expect(rows[0].n).toBe(0);
      expect(
        (await db.pool.query(`SELECT count(*)::int AS n FROM "${schema}".demo_orders`)).rows[0].n,
      ).toBeGreaterThanOrEqual(9);
    });

    it("runs with no DATABASE_URL on an embedded Postgres, and again on the same data folder", async () => {
      const dir = await mkdtemp(path.join(tmpdir(), "outbox-demo-"));
      dirs.push(dir);
      await chmod(dir, 0o755); // as root the server runs as "postgres", which must reach the folder
      const dataDir = path.join(dir, "data");
      const first = await demo(["--orders", "5", "--live", "0", "--data-dir", dataDir]);
      expect(first.stderr).toBe("");
      expect(first.code).toBe(0);
      expect(first.stdout).toContain("starting an embedded Postgres");
      expect(first.stdout).toContain('Installed outbox schema "outbox"');
      // Its own server: nothing to warn about.
      expect(first.stdout).not.toContain("Creating table");
      const second = await demo(["--orders", "5", "--live", "0", "--data-dir", dataDir]);
      expect(second.code).toBe(0);
      expect(second.stdout).toContain('Outbox schema "outbox" is up to date');
      expect(second.stdout).toMatch(
        /Delivered 10 message\(s\) \(order\.placed 5, email\.receipts 5\) in \d+ ms/,
      );
      // The orders of both runs are there: the data folder was reused (the second run's ids follow the first's).
      expect(second.stdout).toMatch(/delivered message (19|20) to order\.placed: order 10 for/);
    }, 300_000);
  });
});
