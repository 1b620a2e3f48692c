import { execFile } from "node:child_process";
import { randomBytes } from "node:crypto";
import { symlink, writeFile } from "node:fs/promises";
import path from "node:path";
import { promisify } from "node:util";
import pg from "pg";
import { afterAll, expect, it } from "vitest";
import { migrate } from "../../src/migrate/migrator.js";
import { testDatabase } from "../support/database.js";
import { docSection } from "../support/docs.js";
import { testTempDir } from "../support/temp-dir.js";

// The "Dedupe keys and cancel" example of docs/guide/dedupe-and-cancel.md, as it is, run by tsx against a database of its own (the
// example uses the default schema `outbox`, which other test files may use): `pg-outbox-worker` resolves to
// this checkout's src, and the `carts` table it updates is created first.

const ROOT = path.resolve(".");
const exec = promisify(execFile);
const db = testDatabase("readme_dedupe");
const database = `readme_dedupe_${randomBytes(4).toString("hex")}`;
const url = (() => {
  const u = new URL(db.url);
  u.pathname = `/${database}`;
  return u.toString();
})();

afterAll(async () => {
  await db.pool.query(`DROP DATABASE IF EXISTS "${database}" WITH (FORCE)`);
});

async function example(): Promise<string> {
  const section = docSection("docs/guide/dedupe-and-cancel.md", "# Dedupe keys and cancel");
  const block = section.match(/```ts\n([\s\S]*?)```/)?.[1];
  if (!block) throw new Error('no ts block in "Dedupe keys and cancel"');
  return block.replace(`from "pg-outbox-worker"`, `from ${JSON.stringify(path.join(ROOT, "src/index.ts"))}`);
}

it("runs the docs' dedupe-and-cancel example: one reminder, cancelled with the payment", {
  timeout: 120_000,
}, async () => {
  await db.pool.query(`CREATE DATABASE "${database}"`);
  await migrate({ connection: url, schema: "outbox" });
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    await client.query("CREATE TABLE carts (id text PRIMARY KEY, paid boolean NOT NULL DEFAULT false)");
    await client.query("INSERT INTO carts (id) VALUES ('c-42')");
    const dir = await testTempDir("docs-dedupe-");
    await symlink(path.join(ROOT, "node_modules"), path.join(dir, "node_modules"));
    await writeFile(path.join(dir, "package.json"), '{"type": "module"}');
    await writeFile(path.join(dir, "example.ts"), await example());
    const run = () =>
      exec(path.join(ROOT, "node_modules/.bin/tsx"), ["example.ts"], {
        cwd: dir,
        env: { ...process.env, DATABASE_URL: url },
        timeout: 60_000,
      });
    const { stdout } = await run();
    expect(stdout).toMatch(/\{ id: '\d+', deduplicated: false \}/);
    expect(stdout).toMatch(/\{ status: 'cancelled', id: '\d+' \}/);
    expect((await client.query("SELECT paid FROM carts")).rows).toEqual([{ paid: true }]);
    expect((await client.query("SELECT count(*)::int AS n FROM outbox.messages")).rows).toEqual([{ n: 0 }]);
  } finally {
    await client.end();
  }
});
