import { describe, expect, it } from "vitest";
import { migrate } from "../../src/migrate/migrator.js";
import { runCli } from "../support/cli-in-process.js";
import { testDatabase } from "../support/database.js";
import { shippedMigrationsUpTo, versionsAfter } from "../support/migrations.js";

/**
 * The inspection commands make `run`'s start-up checks before they read anything (the same code): a schema
 * not migrated, or older than this version, is named with the command that fixes it, never as Postgres'
 * `relation … does not exist`. Missing rights are shown per role in test/cli/grant.test.ts.
 */

const db = testDatabase("ichk");
const env = () => ({ PATH: process.env.PATH, DATABASE_URL: db.url });
const COMMANDS = [
  ["status"],
  ["peek"],
  ["dead-letters", "list"],
  ["dead-letters", "show", "1"],
  ["dead-letters", "replay", "--all", "--dry-run"],
  ["dead-letters", "replay", "--all"],
  ["dead-letters", "purge", "--older-than", "7d"],
];

describe("inspection commands check the schema first", () => {
  it("on a schema never migrated: exit 1 naming `migrate`, no raw relation error", async () => {
    const schema = db.freshSchema("bare");
    for (const args of COMMANDS) {
      const out = await runCli([...args, "--schema", schema], env());
      expect(out.code, args.join(" ")).toBe(1);
      expect(out.stderr, args.join(" ")).toContain(
        `schema "${schema}" is not migrated: run \`outbox-worker migrate --schema ${schema}\` as the schema's owner`,
      );
      expect(out.stderr, args.join(" ")).not.toMatch(/does not exist/);
    }
  });

  it("on a schema older than this version: exit 1 naming the pending migrations", async () => {
    const schema = db.freshSchema("old");
    await migrate({ connection: db.pool, schema, migrationsDir: await shippedMigrationsUpTo(14) });
    const out = await runCli(["status", "--schema", schema], env());
    expect(out.code).toBe(1);
    expect(out.stderr).toContain(
      `schema "${schema}" is older than this version (migrations ${versionsAfter(14).join(", ")} pending): run \`outbox-worker migrate --schema ${schema}\``,
    );
    await migrate({ connection: db.pool, schema });
    expect(await runCli(["status", "--schema", schema], env())).toMatchObject({ code: 0 });
  });
});
