import { access, chmod, mkdir, mkdtemp } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import pg from "pg";
import { afterEach, describe, expect, it } from "vitest";
import { startEmbeddedPostgres } from "../../src/embedded/embedded-postgres.js";
import { removeTempDir } from "../support/remove-temp-dir.js";

// These tests start their own servers and never use the suite's provided database.
describe("startEmbeddedPostgres", () => {
  const roots: string[] = [];

  // removeTempDir also stops a server that a failed test did not get to stop.
  afterEach(async () => {
    await Promise.all(roots.splice(0).map((root) => removeTempDir(root)));
  });

  async function tempRoot(mode = 0o755): Promise<string> {
    const root = await mkdtemp(path.join(tmpdir(), "outbox-embedded-test-"));
    await chmod(root, mode);
    roots.push(root);
    return root;
  }

  async function query<T>(url: string, sql: string): Promise<T[]> {
    const client = new pg.Client({ connectionString: url });
    await client.connect();
    try {
      return (await client.query(sql)).rows as T[];
    } finally {
      await client.end();
    }
  }

  it("runs PostgreSQL 18 and deletes a non-persistent data dir on stop", async () => {
    const dataDir = path.join(await tempRoot(), "pgdata");
    const server = await startEmbeddedPostgres({ dataDir });
    expect(server.url).toBe(
      `postgres://postgres:${new URL(server.url).password}@127.0.0.1:${server.port}/postgres`,
    );
    const [row] = await query<{ version: string }>(server.url, "SELECT version()");
    expect(row?.version).toContain("PostgreSQL 18");
    await server.stop();
    await server.stop();
    await expect(access(dataDir)).rejects.toThrow();
  });

  it("keeps data and password across restarts in persistent mode", { timeout: 180_000 }, async () => {
    const dataDir = path.join(await tempRoot(), "pgdata");
    const first = await startEmbeddedPostgres({ dataDir, persistent: true });
    await query(first.url, "CREATE TABLE kept (id int); INSERT INTO kept VALUES (42)");
    await first.stop();
    await access(path.join(dataDir, "PG_VERSION"));

    const second = await startEmbeddedPostgres({ dataDir, persistent: true });
    try {
      expect(new URL(second.url).password).toBe(new URL(first.url).password);
      expect(await query(second.url, "SELECT id FROM kept")).toEqual([{ id: 42 }]);
    } finally {
      await second.stop();
    }
    await access(path.join(dataDir, "PG_VERSION"));
  });

  it("refuses a non-empty data dir in non-persistent mode, since stop would delete it", async () => {
    const dataDir = await tempRoot();
    await mkdir(path.join(dataDir, "precious"));
    await expect(startEmbeddedPostgres({ dataDir })).rejects.toThrow(/refusing to use non-empty directory/);
    await access(path.join(dataDir, "precious"));
  });

  // Only root runs the server as another OS user ("postgres"), so only then can a 0700 ancestor lock it out.
  it.skipIf(process.getuid?.() !== 0)(
    "rejects a data dir under a folder the postgres user cannot enter",
    async () => {
      const locked = await tempRoot(0o700);
      const dataDir = path.join(locked, "pgdata");
      const attempt = startEmbeddedPostgres({ dataDir });
      await expect(attempt).rejects.toThrow(`cannot enter ${locked} (mode 700`);
      await expect(access(dataDir)).rejects.toThrow();
    },
  );
});
