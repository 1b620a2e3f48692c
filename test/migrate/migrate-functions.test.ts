import { randomBytes } from "node:crypto";
import { cp, readFile, writeFile } from "node:fs/promises";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { MigrationError } from "../../src/contract/errors.js";
import { applyFunctionFiles } from "../../src/migrate/apply-functions.js";
import { functionsDirOf, loadFunctionFiles } from "../../src/migrate/function-files.js";
import { MIGRATIONS_DIR } from "../../src/migrate/migration-files.js";
import { migrate } from "../../src/migrate/migrator.js";
import { dumpSchema } from "../../src/migrate/schema-dump.js";
import { SCHEMA_FILE } from "../../src/migrate/schema-file.js";
import { migrationStatements } from "../../src/sql/migrations.js";
import { outboxNames } from "../../src/sql/names.js";
import { testDatabase } from "../support/database.js";
import { lineDiff } from "../support/line-diff.js";
import { shippedMigrationsUpTo, versionsAfter } from "../support/migrations.js";
import { testTempDir } from "../support/temp-dir.js";

const db = testDatabase("migfn");
const SHIPPED_FUNCTIONS = (await loadFunctionFiles(functionsDirOf(MIGRATIONS_DIR))).map((f) => f.name);
// A role of this file's own: EXECUTE grants must survive a body change and follow a signature change.
const ROLE = `migfn_${randomBytes(4).toString("hex")}`;

beforeAll(async () => {
  await db.pool.query(`CREATE ROLE "${ROLE}" NOLOGIN`);
});
afterAll(async () => {
  await db.pool.query(`DROP OWNED BY "${ROLE}"`);
  await db.pool.query(`DROP ROLE IF EXISTS "${ROLE}"`);
});

/** The shipped migrations and function files, in a folder a test may edit; removed after the test. */
async function shippedCopy(): Promise<string> {
  const dir = await testTempDir("outbox-migrations-");
  await cp(MIGRATIONS_DIR, dir, { recursive: true });
  return dir;
}

async function editFunctionFile(dir: string, name: string, edit: (sql: string) => string): Promise<void> {
  const file = path.join(functionsDirOf(dir), `${name}.sql`);
  const before = await readFile(file, "utf8");
  const after = edit(before);
  expect(after, `the edit of ${name}.sql changed it`).not.toBe(before);
  await writeFile(file, after);
}

async function expectSchemaFile(schema: string): Promise<void> {
  const diff = lineDiff(await readFile(SCHEMA_FILE, "utf8"), await dumpSchema(db.pool, schema));
  expect(diff, `the upgraded schema (+) differs from schema.sql (-):\n${diff}`).toBe("");
}

/** Every function of the schema with that name: its signature, body and who may EXECUTE it. */
async function functionsNamed(schema: string, name: string) {
  const { rows } = await db.pool.query<{ signature: string; src: string; role: boolean; public: boolean }>(
    `SELECT p.oid::regprocedure::text AS signature, p.prosrc AS src,
       has_function_privilege($3, p.oid, 'EXECUTE') AS role,
       EXISTS (SELECT 1 FROM aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) AS a
               WHERE a.grantee = 0 AND a.privilege_type = 'EXECUTE') AS public
     FROM pg_proc AS p WHERE p.pronamespace = $1::regnamespace AND p.proname = $2`,
    [schema, name, ROLE],
  );
  return rows;
}

async function recorded(schema: string, name: string) {
  const { rows } = await db.pool.query(
    `SELECT checksum, package_version FROM "${schema}".schema_functions WHERE name = $1`,
    [name],
  );
  return rows[0] as { checksum: string; package_version: string } | undefined;
}

describe("upgrades", () => {
  it("from 0001 with rows in it: every later migration and every function file, and the schema is schema.sql's", async () => {
    const schema = db.freshSchema("from1");
    await migrate({ connection: db.pool, schema, migrationsDir: await shippedMigrationsUpTo(1) });
    const names = outboxNames(schema);
    await db.pool.query(
      `INSERT INTO ${names.messages} (queue, payload, key) SELECT 'q', jsonb_build_object('n', g), 'k' || (g % 3)
       FROM generate_series(1, 20) AS g`,
    );
    const result = await migrate({ connection: db.pool, schema });
    expect(result.applied.map((m) => m.version)).toEqual(versionsAfter(1));
    expect(result.functions).toEqual({ applied: SHIPPED_FUNCTIONS, keptNewer: [] });
    expect((await db.pool.query(`SELECT count(*)::int AS n FROM ${names.messages}`)).rows[0].n).toBe(20);
    // The rows written before the key heads existed were put in line: one head per key.
    const heads = await db.pool.query(`SELECT count(*)::int AS n FROM ${names.messages} WHERE head`);
    expect(heads.rows[0].n).toBe(3);
    await expectSchemaFile(schema);
  });

  it("from the current release (0021, before function files): 0022 and the files, then nothing", async () => {
    const schema = db.freshSchema("from21");
    await migrate({ connection: db.pool, schema, migrationsDir: await shippedMigrationsUpTo(21) });
    const result = await migrate({ connection: db.pool, schema });
    expect(result.applied.map((m) => m.version)).toEqual(versionsAfter(21));
    expect(result.functions.applied).toEqual(SHIPPED_FUNCTIONS);
    await expectSchemaFile(schema);
    const again = await migrate({ connection: db.pool, schema });
    expect(again).toMatchObject({ applied: [], functions: { applied: [], keptNewer: [] } });
  });
});

describe("function files", () => {
  it("re-applies a changed file exactly once, however many migrators start, and records its new checksum", async () => {
    const schema = db.freshSchema("edit");
    const dir = await shippedCopy();
    await migrate({ connection: db.pool, schema, migrationsDir: dir });
    await db.pool.query(
      `GRANT EXECUTE ON FUNCTION "${schema}".expire_inbox(double precision, integer) TO "${ROLE}"`,
    );
    const old = await recorded(schema, "expire_inbox");
    await editFunctionFile(dir, "expire_inbox", (sql) =>
      sql.replace("BEGIN\n  RETURN QUERY", "BEGIN\n  -- edited body\n  RETURN QUERY"),
    );
    const runs = await Promise.all(
      Array.from({ length: 4 }, () => migrate({ connection: db.url, schema, migrationsDir: dir })),
    );
    expect(runs.flatMap((r) => r.functions.applied)).toEqual(["expire_inbox"]);
    expect(runs.flatMap((r) => r.applied)).toEqual([]);
    const [fn] = await functionsNamed(schema, "expire_inbox");
    expect(fn?.src).toContain("-- edited body");
    // Replaced in place: the grant given to the role stays, PUBLIC's EXECUTE stays revoked.
    expect(fn).toMatchObject({ role: true, public: false });
    const now = await recorded(schema, "expire_inbox");
    const file = (await loadFunctionFiles(functionsDirOf(dir))).find((f) => f.name === "expire_inbox");
    expect(now?.checksum).toBe(file?.checksum);
    expect(now?.checksum).not.toBe(old?.checksum);
    expect((await migrate({ connection: db.pool, schema, migrationsDir: dir })).functions.applied).toEqual(
      [],
    );
  });

  it("drops the old signature when the arguments change, and carries its EXECUTE grants over", async () => {
    const schema = db.freshSchema("sig");
    const dir = await shippedCopy();
    await migrate({ connection: db.pool, schema, migrationsDir: dir });
    await db.pool.query(
      `GRANT EXECUTE ON FUNCTION "${schema}".expire_inbox(double precision, integer) TO "${ROLE}"`,
    );
    await editFunctionFile(dir, "expire_inbox", (sql) =>
      sql.replace(
        "expire_inbox(older_than_ms double precision, max_rows integer)",
        "expire_inbox(older_than_ms double precision, max_rows integer, dry_run boolean DEFAULT false)",
      ),
    );
    expect((await migrate({ connection: db.pool, schema, migrationsDir: dir })).functions.applied).toEqual([
      "expire_inbox",
    ]);
    expect(await functionsNamed(schema, "expire_inbox")).toEqual([
      expect.objectContaining({
        signature: `${schema}.expire_inbox(double precision,integer,boolean)`,
        role: true,
        public: false,
      }),
    ]);
  });

  it("drops and creates in one transaction when the return type changes, which CREATE OR REPLACE refuses", async () => {
    const schema = db.freshSchema("ret");
    const dir = await shippedCopy();
    await migrate({ connection: db.pool, schema, migrationsDir: dir });
    await db.pool.query(
      `GRANT EXECUTE ON FUNCTION "${schema}".expire_inbox(double precision, integer) TO "${ROLE}"`,
    );
    await editFunctionFile(dir, "expire_inbox", (sql) =>
      sql.replace(
        "RETURNS TABLE (queue text, deleted integer)",
        "RETURNS TABLE (queue text, removed integer)",
      ),
    );
    await migrate({ connection: db.pool, schema, migrationsDir: dir });
    const [fn, ...more] = await functionsNamed(schema, "expire_inbox");
    expect(more).toEqual([]);
    expect(fn).toMatchObject({ role: true, public: false });
    const { rows } = await db.pool.query(`SELECT pg_get_function_result($1::regprocedure) AS result`, [
      `"${schema}".expire_inbox(double precision, integer)`,
    ]);
    expect(rows[0].result).toBe("TABLE(queue text, removed integer)");
  });

  it("rolls a failing file back: the old function, its rights and its record stay, and the error names the file", async () => {
    const schema = db.freshSchema("bad");
    const dir = await shippedCopy();
    await migrate({ connection: db.pool, schema, migrationsDir: dir });
    await db.pool.query(
      `GRANT EXECUTE ON FUNCTION "${schema}".expire_inbox(double precision, integer) TO "${ROLE}"`,
    );
    const old = await recorded(schema, "expire_inbox");
    const [before] = await functionsNamed(schema, "expire_inbox");
    // A new return type (the old function is dropped first) and a body that does not parse (the new one fails).
    await editFunctionFile(dir, "expire_inbox", (sql) =>
      sql
        .replace("RETURNS TABLE (queue text, deleted integer)", "RETURNS TABLE (queue text, removed integer)")
        .replace("RETURN QUERY", "RETURN QUERY QUERY"),
    );
    await expect(migrate({ connection: db.pool, schema, migrationsDir: dir })).rejects.toThrow(
      /function file expire_inbox\.sql failed on schema .*syntax error/,
    );
    expect(await recorded(schema, "expire_inbox")).toEqual(old);
    expect(await functionsNamed(schema, "expire_inbox")).toEqual([before]);
  });

  it("creates a new function as the owner's alone, or with the rights of the function grant-as names", async () => {
    const schema = db.freshSchema("new");
    const dir = await shippedCopy();
    await migrate({ connection: db.pool, schema, migrationsDir: dir });
    await db.pool.query(
      `GRANT EXECUTE ON FUNCTION "${schema}".expire_inbox(double precision, integer) TO "${ROLE}"`,
    );
    const body = "LANGUAGE sql AS $$ SELECT 1 $$;\n";
    await writeFile(
      path.join(functionsDirOf(dir), "zz_alone.sql"),
      `CREATE OR REPLACE FUNCTION {{schema}}.zz_alone() RETURNS integer\n${body}`,
    );
    await writeFile(
      path.join(functionsDirOf(dir), "zz_like_inbox.sql"),
      `-- outbox:grant-as expire_inbox(double precision, integer)\nCREATE OR REPLACE FUNCTION {{schema}}.zz_like_inbox() RETURNS integer\n${body}`,
    );
    const result = await migrate({ connection: db.pool, schema, migrationsDir: dir });
    expect(result.functions.applied).toEqual(["zz_alone", "zz_like_inbox"]);
    expect(await functionsNamed(schema, "zz_alone")).toEqual([
      expect.objectContaining({ role: false, public: false }),
    ]);
    expect(await functionsNamed(schema, "zz_like_inbox")).toEqual([
      expect.objectContaining({ role: true, public: false }),
    ]);
  });

  it("never puts back an older body over one a newer release recorded; an older record is replaced", async () => {
    const schema = db.freshSchema("newer");
    const dir = await shippedCopy();
    await migrate({ connection: db.pool, schema, migrationsDir: dir });
    // A newer release's body and record, as its migrate leaves them.
    await db.pool.query(
      `CREATE OR REPLACE FUNCTION "${schema}".topic_queues(topic text) RETURNS text[] LANGUAGE sql AS $$ SELECT '{newer}'::text[] $$`,
    );
    await db.pool.query(
      `UPDATE "${schema}".schema_functions SET checksum = 'from-a-newer-release', package_version = '999.0.0'
       WHERE name = 'topic_queues'`,
    );
    const kept = await migrate({ connection: db.pool, schema, migrationsDir: dir });
    expect(kept.functions).toEqual({ applied: [], keptNewer: ["topic_queues"] });
    expect((await functionsNamed(schema, "topic_queues"))[0]?.src).toContain("{newer}");
    expect(await recorded(schema, "topic_queues")).toMatchObject({ checksum: "from-a-newer-release" });
    // Recorded by an older release instead: this one's body goes in.
    await db.pool.query(
      `UPDATE "${schema}".schema_functions SET package_version = '0.0.1' WHERE name = 'topic_queues'`,
    );
    const replaced = await migrate({ connection: db.pool, schema, migrationsDir: dir });
    expect(replaced.functions).toEqual({ applied: ["topic_queues"], keptNewer: [] });
    expect((await functionsNamed(schema, "topic_queues"))[0]?.src).not.toContain("{newer}");
  });

  /** A copy of the shipped files whose expire_inbox body carries `mark`: one build's function files. */
  async function build(mark: string): Promise<string> {
    const dir = await shippedCopy();
    await editFunctionFile(dir, "expire_inbox", (sql) =>
      sql.replace("BEGIN\n  RETURN QUERY", `BEGIN\n  -- ${mark}\n  RETURN QUERY`),
    );
    return dir;
  }

  /** The function files of `dir` applied as release `version` applies them (migrate's own step). */
  async function applyAs(schema: string, dir: string, version: string) {
    const names = outboxNames(schema);
    const files = await loadFunctionFiles(functionsDirOf(dir));
    const client = await db.pool.connect();
    try {
      return await applyFunctionFiles(client, files, names, migrationStatements(names), version);
    } finally {
      client.release();
    }
  }

  const liveBody = async (schema: string) => (await functionsNamed(schema, "expire_inbox"))[0]?.src;

  it("never flips a body between a release candidate and its release migrating in turn: the release's stays", async () => {
    const schema = db.freshSchema("rc");
    const [candidate, release] = [await build("candidate body"), await build("release body")];
    await migrate({ connection: db.pool, schema, migrationsDir: await shippedCopy() });
    const runs = [];
    for (let round = 0; round < 2; round++) {
      runs.push((await applyAs(schema, release, "0.2.0")).applied);
      runs.push((await applyAs(schema, candidate, "0.2.0-rc.1")).applied);
    }
    // The release's body goes in once (over 0.1.0's record); the candidate's never does.
    expect(runs).toEqual([["expire_inbox"], [], [], []]);
    expect(await liveBody(schema)).toContain("release body");
    expect(await recorded(schema, "expire_inbox")).toMatchObject({ package_version: "0.2.0" });
  });

  it("never flips a body between two builds of one version migrating in turn: the last new body stays", async () => {
    const schema = db.freshSchema("builds");
    const [a, b, c] = [await build("build a"), await build("build b"), await build("build c")];
    const run = async (dir: string) =>
      (await migrate({ connection: db.pool, schema, migrationsDir: dir })).functions;
    await run(a);
    expect(await run(b)).toEqual({ applied: ["expire_inbox"], keptNewer: [] });
    // a's body was replaced under this version: a keeps b's, now and every time after.
    expect(await run(a)).toEqual({ applied: [], keptNewer: ["expire_inbox"] });
    expect(await run(b)).toEqual({ applied: [], keptNewer: [] });
    expect(await run(a)).toEqual({ applied: [], keptNewer: ["expire_inbox"] });
    expect(await liveBody(schema)).toContain("build b");
    // A body new to this version still goes in (a developer's edit, a fix build), and then stays.
    expect(await run(c)).toEqual({ applied: ["expire_inbox"], keptNewer: [] });
    for (const dir of [a, b]) expect(await run(dir)).toEqual({ applied: [], keptNewer: ["expire_inbox"] });
    expect(await liveBody(schema)).toContain("build c");
    const { rows } = await db.pool.query(
      `SELECT cardinality(replaced_checksums) AS n FROM "${schema}".schema_functions WHERE name = 'expire_inbox'`,
    );
    expect(rows).toEqual([{ n: 2 }]);
  });

  it("refuses a file that does not define the function it is named after", async () => {
    const dir = await shippedCopy();
    await writeFile(
      path.join(functionsDirOf(dir), "misnamed.sql"),
      "CREATE OR REPLACE FUNCTION {{schema}}.other() RETURNS integer LANGUAGE sql AS $$ SELECT 1 $$;\n",
    );
    const run = migrate({ connection: db.pool, schema: db.freshSchema("misnamed"), migrationsDir: dir });
    await expect(run).rejects.toThrow(MigrationError);
    await expect(loadFunctionFiles(functionsDirOf(dir))).rejects.toThrow(
      /"misnamed.sql" must hold exactly one CREATE OR REPLACE FUNCTION \{\{schema\}\}\.misnamed\(…\); it defines other/,
    );
  });
});
