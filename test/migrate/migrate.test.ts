import { execFileSync } from "node:child_process";
import { readFile, writeFile } from "node:fs/promises";
import path from "node:path";
import pg from "pg";
import { beforeAll, describe, expect, it } from "vitest";
import { MigrationError, OutboxConfigError } from "../../src/contract/errors.js";
import { migrate, migrationState, printMigrations } from "../../src/migrate/migrator.js";
import { completeStatements } from "../../src/sql/complete.js";
import { runQuery } from "../../src/sql/executor.js";
import { outboxNames } from "../../src/sql/names.js";
import { testDatabase } from "../support/database.js";
import { LATEST_VERSION, shippedMigrationsUpTo, versionsAfter } from "../support/migrations.js";
import { testTempDir } from "../support/temp-dir.js";
import { until } from "../support/worker.js";

const db = testDatabase("mig");

/** A private migrations folder, so a test can add, reorder and edit files; removed after the test. */
async function migrationsDir(files: Record<string, string>): Promise<string> {
  const dir = await testTempDir("outbox-migrations-");
  for (const [name, sql] of Object.entries(files)) await writeFile(path.join(dir, name), sql);
  return dir;
}

async function tableExists(schema: string, table: string): Promise<boolean> {
  const { rows } = await db.pool.query("SELECT to_regclass($1) IS NOT NULL AS ok", [`"${schema}".${table}`]);
  return rows[0].ok;
}

describe("migrate", () => {
  beforeAll(() => db.migrate());

  it("creates the tables, view, indexes and records the version", async () => {
    for (const t of ["messages", "dead_letters", "subscriptions", "unprocessed", "schema_migrations"]) {
      expect(await tableExists(db.schema, t)).toBe(true);
    }
    const { rows } = await db.pool.query(`SELECT version, name FROM ${db.names.migrationsTable}`);
    expect(rows).toEqual([
      { version: 1, name: "0001_outbox" },
      { version: 2, name: "0002_failures_count" },
      { version: 3, name: "0003_key_heads" },
      { version: 4, name: "0004_key_heads_index" },
      { version: 5, name: "0005_ack_keyed_own_locks" },
      { version: 6, name: "0006_ack_key_heads" },
      { version: 7, name: "0007_below_head" },
      { version: 8, name: "0008_below_head_index" },
      { version: 9, name: "0009_promote_after_head" },
      { version: 10, name: "0010_finite_rows" },
      { version: 11, name: "0011_finite_rows_validate" },
      { version: 12, name: "0012_topics" },
      { version: 13, name: "0013_unrouted_index" },
      { version: 14, name: "0014_fan_out_cached_plans" },
      { version: 15, name: "0015_narrow_roles" },
      { version: 16, name: "0016_inbox" },
      { version: 17, name: "0017_dedupe_keys" },
      { version: 18, name: "0018_failure_announcements" },
      { version: 20, name: "0020_dedupe_keys_index" },
      { version: 21, name: "0021_hot_leases" },
      { version: 22, name: "0022_function_files" },
      { version: 23, name: "0023_transaction_leases" },
      { version: 24, name: "0024_batch_leases" },
      { version: 25, name: "0025_function_history" },
      { version: 26, name: "0026_alone_guards" },
    ]);
    const idx = await db.pool.query("SELECT indexname FROM pg_indexes WHERE schemaname = $1 ORDER BY 1", [
      db.schema,
    ]);
    expect(idx.rows.map((r) => r.indexname)).toEqual(
      expect.arrayContaining([
        "messages_due_idx",
        "messages_behind_idx",
        "messages_key_idx",
        "messages_below_head_idx",
        "messages_dedupe_key_idx",
      ]),
    );
    // The ready index of before per-key ordering is gone: every unleased row is in exactly one of the two.
    expect(idx.rows.map((r) => r.indexname)).not.toContain("messages_ready_idx");
    const opts = await db.pool.query("SELECT reloptions FROM pg_class WHERE oid = to_regclass($1)", [
      db.names.messages,
    ]);
    // Room on each page for a leased copy of every row: leases are HOT updates (0021).
    expect(opts.rows[0].reloptions).toEqual(expect.arrayContaining(["fillfactor=40"]));
  });

  it("is a no-op the second time", async () => {
    const again = await db.migrate();
    expect(again.applied).toEqual([]);
    expect(again.version).toBe(LATEST_VERSION);
    expect((await migrationState({ connection: db.pool, schema: db.schema })).current).toBe(true);
  });

  it("enforces the lease CHECK: token, acquired_at and expiry are set together", async () => {
    await expect(
      db.pool.query(
        `INSERT INTO ${db.names.messages} (queue, payload, acquired_token) VALUES ('q', '{}', gen_random_uuid())`,
      ),
    ).rejects.toThrow(/messages_lease_complete/);
  });

  it("applies files in version order, each once, and records them", async () => {
    const schema = db.freshSchema("order");
    const dir = await migrationsDir({
      "0002_second.sql": "INSERT INTO {{schema}}.log VALUES (2);",
      "0010_tenth.sql": "INSERT INTO {{schema}}.log VALUES (10);",
      "0001_first.sql": "CREATE TABLE {{schema}}.log (n int); INSERT INTO {{schema}}.log VALUES (1);",
    });
    const seen: number[] = [];
    const result = await migrate({
      connection: db.url,
      schema,
      migrationsDir: dir,
      onApplied: (m) => seen.push(m.version),
    });
    expect(seen).toEqual([1, 2, 10]);
    expect(result.version).toBe(10);
    const { rows } = await db.pool.query(`SELECT array_agg(n ORDER BY ctid) AS ns FROM "${schema}".log`);
    expect(rows[0].ns).toEqual([1, 2, 10]);
  });

  it("rolls back a failing migration and keeps the earlier ones", async () => {
    const schema = db.freshSchema("fail");
    const dir = await migrationsDir({
      "0001_ok.sql": "CREATE TABLE {{schema}}.a (n int);",
      "0002_bad.sql": "CREATE TABLE {{schema}}.b (n int); SELECT 1/0;",
    });
    await expect(migrate({ connection: db.pool, schema, migrationsDir: dir })).rejects.toThrow(
      /0002_bad failed.*division by zero/,
    );
    expect(await tableExists(schema, "a")).toBe(true);
    expect(await tableExists(schema, "b")).toBe(false);
    const state = await migrationState({ connection: db.pool, schema, migrationsDir: dir });
    expect(state).toMatchObject({ applied: [1], pending: [2], current: false });
  });

  it("runs a no-transaction file statement by statement, so CREATE INDEX CONCURRENTLY works, once", async () => {
    const schema = db.freshSchema("conc");
    const files = {
      "0001_table.sql":
        "CREATE TABLE {{schema}}.t (n int, k text); INSERT INTO {{schema}}.t SELECT g, 'k' FROM generate_series(1, 1000) g;",
      "0002_index.sql":
        "-- outbox:no-transaction\n-- a comment; with a semicolon\nCREATE INDEX CONCURRENTLY IF NOT EXISTS t_k_idx ON {{schema}}.t (k);\nCREATE INDEX CONCURRENTLY IF NOT EXISTS t_n_idx ON {{schema}}.t (n);\n",
    };
    const dir = await migrationsDir(files);
    // In a transaction (as every other file runs) this fails: "cannot run inside a transaction block".
    const result = await migrate({ connection: db.pool, schema, migrationsDir: dir });
    expect(result.applied.map((m) => m.version)).toEqual([1, 2]);
    const { rows } = await db.pool.query(
      `SELECT c.relname AS name, i.indisvalid AS valid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
       JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND i.indrelid = to_regclass($2) ORDER BY 1`,
      [schema, `"${schema}".t`],
    );
    expect(rows).toEqual([
      { name: "t_k_idx", valid: true },
      { name: "t_n_idx", valid: true },
    ]);
    expect((await migrate({ connection: db.pool, schema, migrationsDir: dir })).applied).toEqual([]);
    const printed = await printMigrations({ schema, migrationsDir: dir });
    const block = printed.slice(printed.indexOf("-- 0002_index"));
    expect(block).toContain("-- runs outside a transaction, one statement at a time");
    expect(block).not.toContain("BEGIN;");
  });

  it("rebuilds an index a concurrent build left INVALID when it crashed halfway", async () => {
    const schema = db.freshSchema("crash");
    const dir = await migrationsDir({
      "0001_table.sql":
        "CREATE TABLE {{schema}}.t (n int); INSERT INTO {{schema}}.t SELECT generate_series(1, 100);",
      "0002_index.sql":
        "-- outbox:no-transaction\nCREATE INDEX CONCURRENTLY IF NOT EXISTS t_n_idx ON {{schema}}.t (n);\n",
    });
    await migrate({ connection: db.pool, schema, migrationsDir: dir });
    await db.pool.query(`DROP INDEX "${schema}".t_n_idx`);
    await db.pool.query(`DELETE FROM ${`"${schema}".schema_migrations`} WHERE version = 2`);
    // A crash halfway: a concurrent build waits for an open transaction, and is cancelled while it waits.
    const holder = new pg.Client({ connectionString: db.url });
    const builder = new pg.Client({ connectionString: db.url });
    await Promise.all([holder.connect(), builder.connect()]);
    try {
      await holder.query("BEGIN ISOLATION LEVEL REPEATABLE READ");
      await holder.query(`SELECT count(*) FROM "${schema}".t`);
      const pid = (await builder.query("SELECT pg_backend_pid() AS pid")).rows[0].pid;
      const build = builder
        .query(`CREATE INDEX CONCURRENTLY t_n_idx ON "${schema}".t (n)`)
        .catch((e: Error) => e);
      const waiting = async () =>
        (await db.pool.query("SELECT wait_event_type FROM pg_stat_activity WHERE pid = $1", [pid])).rows[0]
          ?.wait_event_type === "Lock";
      // Cancelled while it waits for the holder, after its catalog entry exists: what leaves it INVALID.
      await until(waiting, "the concurrent build waiting for the holder's snapshot");
      await db.pool.query("SELECT pg_cancel_backend($1)", [pid]);
      expect(String(await build)).toMatch(/cancel/);
      await holder.query("ROLLBACK");
    } finally {
      await Promise.all([holder.end(), builder.end()]);
    }
    const valid = async () =>
      (
        await db.pool.query(
          `SELECT i.indisvalid AS valid FROM pg_index i WHERE i.indexrelid = to_regclass($1)`,
          [`"${schema}".t_n_idx`],
        )
      ).rows[0]?.valid;
    expect(await valid()).toBe(false);
    // IF NOT EXISTS alone would skip the broken index: the migrator drops it and builds it again.
    expect(
      (await migrate({ connection: db.pool, schema, migrationsDir: dir })).applied.map((m) => m.version),
    ).toEqual([2]);
    expect(await valid()).toBe(true);
  });

  it("refuses dollar quoting in a no-transaction file (it is split at semicolons)", async () => {
    const dir = await migrationsDir({
      "0001_fn.sql":
        "-- outbox:no-transaction\nCREATE FUNCTION {{schema}}.f() RETURNS int AS $$ SELECT 1; $$ LANGUAGE sql;\n",
    });
    await expect(
      migrate({ connection: db.pool, schema: db.freshSchema("dollar"), migrationsDir: dir }),
    ).rejects.toThrow(/must not use dollar quoting/);
  });

  it("lets many processes start at once: each file runs exactly once", async () => {
    const schema = db.freshSchema("race");
    const dir = await migrationsDir({
      // pg_sleep widens the window in which an unlocked migrator would run the file twice.
      "0001_slow.sql":
        "CREATE TABLE {{schema}}.runs (n int); SELECT pg_sleep(0.2); INSERT INTO {{schema}}.runs VALUES (1);",
      "0002_more.sql": "INSERT INTO {{schema}}.runs VALUES (2);",
    });
    const results = await Promise.all(
      Array.from({ length: 6 }, () => migrate({ connection: db.url, schema, migrationsDir: dir })),
    );
    expect(results.flatMap((r) => r.applied.map((a) => a.version)).sort()).toEqual([1, 2]);
    const { rows } = await db.pool.query(`SELECT count(*)::int AS n FROM "${schema}".runs`);
    expect(rows[0].n).toBe(2);
  });

  it("refuses to continue when an applied file changed", async () => {
    const schema = db.freshSchema("drift");
    const dir = await migrationsDir({ "0001_a.sql": "CREATE TABLE {{schema}}.a (n int);" });
    await migrate({ connection: db.pool, schema, migrationsDir: dir });
    await writeFile(path.join(dir, "0001_a.sql"), "CREATE TABLE {{schema}}.a (n bigint);");
    await writeFile(path.join(dir, "0002_b.sql"), "CREATE TABLE {{schema}}.b (n int);");
    const run = migrate({ connection: db.pool, schema, migrationsDir: dir });
    await expect(run).rejects.toThrow(MigrationError);
    await expect(migrate({ connection: db.pool, schema, migrationsDir: dir })).rejects.toThrow(
      /0001_a was changed after it was applied/,
    );
    expect(await tableExists(schema, "b")).toBe(false);
  });

  it("ignores line-ending changes (CRLF checkouts)", async () => {
    const schema = db.freshSchema("crlf");
    const dir = await migrationsDir({ "0001_a.sql": "CREATE TABLE {{schema}}.a (n int);\nSELECT 1;\n" });
    await migrate({ connection: db.pool, schema, migrationsDir: dir });
    const file = path.join(dir, "0001_a.sql");
    await writeFile(file, (await readFile(file, "utf8")).replaceAll("\n", "\r\n"));
    await expect(migrate({ connection: db.pool, schema, migrationsDir: dir })).resolves.toMatchObject({
      applied: [],
    });
  });

  it("refuses a database that is newer than the code", async () => {
    const schema = db.freshSchema("newer");
    const dir = await migrationsDir({ "0001_a.sql": "SELECT 1;" });
    await migrate({ connection: db.pool, schema, migrationsDir: dir });
    await db.pool.query(
      `INSERT INTO "${schema}".schema_migrations (version, name, checksum) VALUES (7, 'x', 'y')`,
    );
    await expect(migrate({ connection: db.pool, schema, migrationsDir: dir })).rejects.toThrow(
      /does not know: the database is newer/,
    );
  });

  it.each(['x"; drop table t;--', "Robert'); DROP TABLE students;--", "a b", "pg_temp", "a".repeat(64)])(
    "rejects the hostile schema name %j before connecting",
    async (schema) => {
      // Port 1 refuses connections: reaching it would fail with ECONNREFUSED, not a config error.
      const unreachable = "postgres://nobody@127.0.0.1:1/none";
      await expect(migrate({ connection: unreachable, schema })).rejects.toThrow(OutboxConfigError);
      await expect(printMigrations({ schema })).rejects.toThrow(OutboxConfigError);
    },
  );

  it("prints SQL that installs the schema and that migrate then treats as applied", async () => {
    const schema = db.freshSchema("print");
    const printed = await printMigrations({ schema });
    expect(printed).not.toContain("{{");
    // As a team's own tool runs it: statement by statement (psql), since CREATE INDEX CONCURRENTLY cannot
    // run inside the implicit transaction of one multi-statement query.
    execFileSync("psql", ["-X", "-q", "-v", "ON_ERROR_STOP=1", db.url], { input: printed, stdio: "pipe" });
    expect(await tableExists(schema, "messages")).toBe(true);
    const result = await migrate({ connection: db.pool, schema });
    expect(result.applied).toEqual([]);
    // The function files too: printed with their bodies and recorded as migrate records them.
    expect(result.functions).toEqual({ applied: [], keptNewer: [] });
  });
});

describe("migrate(connection)", () => {
  it("takes a bare pool (default schema), and refuses a call without a connection by name", async () => {
    // A database of its own: the default schema "outbox" is not this suite's to create in the shared one.
    const database = `migrate_pool_${process.pid}_${Date.now()}`;
    const url = new URL(db.url);
    url.pathname = `/${database}`;
    await db.pool.query(`CREATE DATABASE "${database}"`);
    const pool = new pg.Pool({ connectionString: url.toString(), max: 2 });
    try {
      const result = await migrate(pool);
      expect(result).toMatchObject({ schema: "outbox", version: LATEST_VERSION });
      expect(result.applied.map((a) => a.version)).toEqual(versionsAfter(0));
      expect((await migrate(pool)).applied).toEqual([]);
    } finally {
      await pool.end();
      await db.pool.query(`DROP DATABASE IF EXISTS "${database}" WITH (FORCE)`);
    }
    const refusal = /migrate\(\) takes \{ connection, schema\? \} or the connection itself/;
    await expect(migrate(undefined as never)).rejects.toThrow(MigrationError);
    await expect(migrate(undefined as never)).rejects.toThrow(refusal);
    await expect(migrate({ schema: "x" } as never)).rejects.toThrow(
      /got an object whose connection is undefined/,
    );
    await expect(migrate({ connection: {} } as never)).rejects.toThrow(/without query\(\) and connect\(\)/);
  });
});

describe("0007–0009: the promotion looks above the deleted head", () => {
  it("marks the rows already below a head of their key, so that head's ack still promotes them first", async () => {
    const schema = db.freshSchema("below");
    await migrate({ connection: db.pool, schema, migrationsDir: await shippedMigrationsUpTo(6) });
    const names = outboxNames(schema);
    const m = names.messages;
    const insert = async (key: string | null, id?: number) =>
      (
        await db.pool.query<{ id: string }>(
          `INSERT INTO ${m} ${id ? "(id, queue, payload, key) OVERRIDING SYSTEM VALUE" : "(queue, payload, key)"}
           VALUES (${id ? `${id}, ` : ""}'q', '{}', $1) RETURNING id::text`,
          [key],
        )
      ).rows[0]?.id as string;
    // At version 6: a keyless row (1), then key a's head (2) and the row behind it (3). Row 1 goes, and a
    // dead letter of key a comes back with that old id, as a replay does: below the head of its key.
    const [keyless, head, behind] = [await insert(null), await insert("a"), await insert("a")];
    await db.pool.query(`DELETE FROM ${m} WHERE id = $1`, [keyless]);
    const replayed = await insert("a", Number(keyless));
    const result = await migrate({ connection: db.pool, schema });
    expect(result.applied.map((v) => v.version)).toEqual(versionsAfter(6));
    const marks = await db.pool.query(`SELECT id::text, head, below_head FROM ${m} ORDER BY id`);
    expect(marks.rows).toEqual([
      { id: replayed, head: false, below_head: true },
      { id: head, head: true, below_head: false },
      { id: behind, head: false, below_head: false },
    ]);
    // The head leased and acked as a worker does: the row promoted (and handed off) is the replayed one,
    // below the head, not the one above it.
    const token = "00000000-0000-4000-8000-000000000001";
    await db.pool.query(
      `UPDATE ${m} SET acquired_token = $1, acquired_at = now(), lease_expires_at = now() + interval '1 minute'
       WHERE id = $2`,
      [token, head],
    );
    const rows = await runQuery(db.pool, completeStatements(names, { synchronousCommit: true }).ackKeyHeads, {
      ids: `{${head}}`,
      tokens: `{${token}}`,
      queues: "{q}",
      keys: "{a}",
      limit: 1,
      token: "00000000-0000-4000-8000-000000000002",
      leaseTtlMs: 60_000,
      workerId: "w",
    });
    expect(rows.filter((r) => r.kind === "promoted").map((r) => [r.id, r.taken])).toEqual([[replayed, true]]);
    // Published from now on, in order: not below anything.
    await insert("a");
    expect((await db.pool.query(`SELECT count(*)::int AS n FROM ${m} WHERE below_head`)).rows[0].n).toBe(1);
  });
});

describe("0010–0011: every stored time is finite", () => {
  it("gives rows of an older schema a finite time in place of an infinite one, says so, and validates the CHECKs", async () => {
    const schema = db.freshSchema("finite");
    await migrate({ connection: db.pool, schema, migrationsDir: await shippedMigrationsUpTo(9) });
    const names = outboxNames(schema);
    await db.pool.query(
      `INSERT INTO ${names.messages} (queue, payload, created_at, available_at, first_attempt_at, last_error)
       VALUES ('q', '{}', '-infinity', 'infinity', '-infinity', 'boom'), ('q', '{}', now(), now(), NULL, NULL)`,
    );
    await db.pool.query(
      `INSERT INTO ${names.deadLetters} (id, queue, payload, headers, created_at, available_at, deliveries_count,
         attempts_count, dead_at, reason) VALUES (1, 'q', '{}', '{}', 'infinity', now(), 1, 1, '-infinity', 'rejected')`,
    );
    const result = await migrate({ connection: db.pool, schema });
    expect(result.applied.map((v) => v.version)).toEqual(versionsAfter(9));
    const rows = await db.pool.query(
      `SELECT isfinite(created_at) AND isfinite(available_at) AS finite, first_attempt_at, last_error
       FROM ${names.messages} ORDER BY id`,
    );
    expect(rows.rows).toEqual([
      {
        finite: true,
        first_attempt_at: null,
        last_error: "an infinite timestamp was replaced by migration 0011 | boom",
      },
      { finite: true, first_attempt_at: null, last_error: null },
    ]);
    const dead = await db.pool.query(
      `SELECT isfinite(created_at) AND isfinite(dead_at) AS finite FROM ${names.deadLetters}`,
    );
    expect(dead.rows).toEqual([{ finite: true }]);
    const constraints = await db.pool.query(
      `SELECT conname, convalidated FROM pg_constraint
       WHERE conrelid IN ($1::regclass, $2::regclass) AND conname LIKE '%finite%' ORDER BY 1`,
      [names.messages, names.deadLetters],
    );
    expect(constraints.rows).toEqual([
      { conname: "dead_letters_finite_times", convalidated: true },
      { conname: "messages_finite_times", convalidated: true },
    ]);
  });
});
