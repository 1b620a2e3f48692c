import { randomBytes, randomUUID } from "node:crypto";
import path from "node:path";
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { FOLLOW_UPS_REFUSED, followUp } from "../../src/contract/follow-up.js";
import { PermanentError, TransientError } from "../../src/contract/handler-errors.js";
import { listDeadLetters, purgeDeadLetters, replayDeadLetters } from "../../src/inspect/dead-letters.js";
import { peekMessages } from "../../src/inspect/peek.js";
import { queueStatus, workerLeases } from "../../src/inspect/status.js";
import { tableHealth } from "../../src/inspect/table-health.js";
import { migrate, migrationState } from "../../src/migrate/migrator.js";
import { constant } from "../../src/retry/strategies.js";
import { createDeadLetterRetention } from "../../src/service/dead-letter-retention.js";
import { checkSchema, warnIfNotVacuumed } from "../../src/service/startup.js";
import { completeStatements } from "../../src/sql/complete.js";
import { expireDeadLettersStatement } from "../../src/sql/dead-letters.js";
import { run, runQuery } from "../../src/sql/executor.js";
import { fetchStatement } from "../../src/sql/fetch.js";
import {
  INSPECTOR_SELECT_COLUMNS,
  PRODUCER_DEDUPE_COLUMNS,
  PRODUCER_INSERT_COLUMNS,
  PRODUCER_SELECT_COLUMNS,
  REPAIR_INSERT_COLUMNS,
  SUBSCRIBE_COLUMNS,
  WORKER_UPDATE_COLUMNS,
} from "../../src/sql/grants.js";
import { inboxStatements } from "../../src/sql/inbox.js";
import { repairKeyHeadsStatement } from "../../src/sql/key-heads.js";
import { repairGuardsStatement } from "../../src/sql/lease-guards.js";
import { produceStatements } from "../../src/sql/produce.js";
import {
  listSubscriptions,
  subscribe,
  subscribersOf,
  unsubscribe,
} from "../../src/subscribe/subscriptions.js";
import { handleInTransaction } from "../../src/worker/options.js";
import { runCli } from "../support/cli-in-process.js";
import { serviceEnv, startCli } from "../support/cli-process.js";
import { testDatabase } from "../support/database.js";
import { memoryLogger } from "../support/memory-logger.js";
import { shippedMigrationsUpTo, versionsAfter } from "../support/migrations.js";
import { nextEvent, publisherFor, until, workerFactory } from "../support/worker.js";

/**
 * Each side's rights, on a real server: what every role can do as the CLI and the worker do it, what it is
 * refused, and (by taking one right away at a time) that each right it has is needed.
 */

const db = testDatabase("grt");
const { names, schema } = db;
const outbox = publisherFor(schema);
const tag = randomBytes(4).toString("hex");
const role = {
  producer: `grt_producer_${tag}`,
  worker: `grt_worker_${tag}`,
  inspector: `grt_inspector_${tag}`,
  repairer: `grt_repairer_${tag}`,
  expirer: `grt_expirer_${tag}`,
  chainer: `grt_chainer_${tag}`,
  subscriber: `grt_subscriber_${tag}`,
};
const ROLES = Object.values(role);
// The embedded test server asks every login for a password (scram); a trust-auth server ignores it.
const ROLE_PASSWORD = randomBytes(12).toString("hex");

function urlAs(name: string): string {
  const url = new URL(db.url);
  url.username = name;
  url.password = ROLE_PASSWORD;
  return url.toString();
}

const pools: pg.Pool[] = [];
function poolAs(name: string): pg.Pool {
  const pool = new pg.Pool({ connectionString: urlAs(name), max: 4 });
  pools.push(pool);
  return pool;
}

const cli = (name: string, args: string[]) =>
  runCli([...args, "--schema", schema], { PATH: process.env.PATH, DATABASE_URL: urlAs(name) });

/** Runs `op` and returns the error's message, failing the test when it does not fail. */
async function refused(op: () => Promise<unknown>): Promise<string> {
  try {
    await op();
  } catch (error) {
    return String((error as Error).message);
  }
  throw new Error("expected a refusal, and it ran");
}

/** A CLI call as an operation: throws with its stderr when it fails. */
async function cliOk(name: string, args: string[]): Promise<string> {
  const result = await cli(name, args);
  if (result.code !== 0) throw new Error(result.stderr);
  return result.stdout;
}

let producer: pg.Pool;
let worker: pg.Pool;
let inspector: pg.Pool;
let repairer: pg.Pool;
let expirer: pg.Pool;
let subscriber: pg.Pool;

beforeAll(async () => {
  await db.migrate();
  for (const name of ROLES) await db.pool.query(`CREATE ROLE "${name}" LOGIN PASSWORD '${ROLE_PASSWORD}'`);
  const owner = { PATH: process.env.PATH, DATABASE_URL: db.url };
  const first = await runCli(
    [
      "grant",
      "--schema",
      schema,
      "--producer",
      role.producer,
      "--worker",
      role.worker,
      "--inspector",
      role.inspector,
    ],
    owner,
  );
  expect(first, first.stderr).toMatchObject({ code: 0 });
  const second = await runCli(
    ["grant", "--schema", schema, "--inspector", role.repairer, "--inspector-can-repair"],
    owner,
  );
  expect(second, second.stderr).toMatchObject({ code: 0 });
  const third = await runCli(
    ["grant", "--schema", schema, "--worker", role.expirer, "--worker-can-expire"],
    owner,
  );
  expect(third, third.stderr).toMatchObject({ code: 0 });
  const fourth = await runCli(
    ["grant", "--schema", schema, "--worker", role.chainer, "--worker-can-follow-up"],
    owner,
  );
  expect(fourth, fourth.stderr).toMatchObject({ code: 0 });
  const fifth = await runCli(
    ["grant", "--schema", schema, "--worker", role.subscriber, "--worker-can-subscribe"],
    owner,
  );
  expect(fifth, fifth.stderr).toMatchObject({ code: 0 });
  expect(fifth.stdout).toContain(`to ${role.subscriber} (with subscribing)`);
  producer = poolAs(role.producer);
  worker = poolAs(role.worker);
  inspector = poolAs(role.inspector);
  repairer = poolAs(role.repairer);
  expirer = poolAs(role.expirer);
  subscriber = poolAs(role.subscriber);
});

afterAll(async () => {
  await Promise.all(pools.map((p) => p.end()));
  // Roles are cluster-wide: leave none behind (DROP OWNED also takes their grants away).
  for (const name of ROLES) {
    await db.pool.query(`DROP OWNED BY "${name}"`).catch(() => {});
    await db.pool.query(`DROP ROLE IF EXISTS "${name}"`);
  }
});

/** Every privilege a role holds on the schema and its objects, as "object: PRIV" lines. */
async function privilegesOf(name: string): Promise<string[]> {
  const { rows } = await db.pool.query<{ p: string }>(
    `WITH rels AS (
  SELECT c.oid, c.relname, c.relkind FROM pg_class AS c WHERE c.relnamespace = $2::regnamespace AND c.relkind IN ('r', 'v', 'S')
)
SELECT 'schema: ' || p AS p FROM unnest(ARRAY['USAGE', 'CREATE']) AS p WHERE has_schema_privilege($1, $2, p)
UNION ALL
SELECT r.relname || ': ' || p FROM rels AS r, unnest(ARRAY['SELECT', 'INSERT', 'UPDATE', 'DELETE', 'TRUNCATE', 'REFERENCES', 'TRIGGER']) AS p
WHERE r.relkind <> 'S' AND has_table_privilege($1, r.oid, p)
UNION ALL
SELECT r.relname || ': ' || p FROM rels AS r, unnest(ARRAY['USAGE', 'SELECT', 'UPDATE']) AS p
WHERE r.relkind = 'S' AND has_sequence_privilege($1, r.oid, p)
UNION ALL
SELECT r.relname || '.' || a.attname || ': ' || p FROM rels AS r
JOIN pg_attribute AS a ON a.attrelid = r.oid AND a.attnum > 0 AND NOT a.attisdropped,
unnest(ARRAY['SELECT', 'INSERT', 'UPDATE', 'REFERENCES']) AS p
WHERE r.relkind <> 'S' AND has_column_privilege($1, r.oid, a.attnum, p) AND NOT has_table_privilege($1, r.oid, p)
UNION ALL
SELECT f.proname || ': EXECUTE' FROM pg_proc AS f
WHERE f.pronamespace = $2::regnamespace AND has_function_privilege($1, f.oid, 'EXECUTE')
ORDER BY 1`,
    [name, schema],
  );
  return rows.map((r) => r.p);
}

const columns = (table: string, list: readonly string[], priv: string) =>
  list.map((c) => `${table}.${c}: ${priv}`);

describe("outbox-worker grant: what each role holds", () => {
  it("gives each role exactly its side's rights and nothing else on the schema", async () => {
    expect(await privilegesOf(role.producer)).toEqual(
      [
        "schema: USAGE",
        ...columns("messages", PRODUCER_INSERT_COLUMNS, "INSERT"),
        "messages.topic: INSERT",
        ...columns("messages", PRODUCER_DEDUPE_COLUMNS, "INSERT"),
        ...columns("messages", PRODUCER_SELECT_COLUMNS, "SELECT"),
        ...columns("messages", PRODUCER_DEDUPE_COLUMNS, "SELECT"),
        "fan_out: EXECUTE",
        "topic_queues: EXECUTE",
        "copy_to_queues: EXECUTE",
        // Cancel by dedupe key runs as the owner: the producer holds no DELETE on messages.
        "cancel: EXECUTE",
      ].sort(),
    );
    const workerRights = [
      "schema: USAGE",
      "messages: SELECT",
      ...columns("messages", WORKER_UPDATE_COLUMNS, "UPDATE"),
      "messages: DELETE",
      "dead_letters: SELECT",
      "leases: SELECT",
      "schema_migrations: SELECT",
      "ack_keyed: EXECUTE",
      "ack_key_heads: EXECUTE",
      "promote_heads: EXECUTE",
      "promote_heads_after: EXECUTE",
      "dead_letter: EXECUTE",
      "dead_letter_announced: EXECUTE",
      "topic_queues: EXECUTE",
      "batch_leased: EXECUTE",
      "inbox: SELECT",
      "inbox: INSERT",
      "expire_inbox: EXECUTE",
      // Transaction-held batches (migration 0023): their guards, and the repair keeping locked rows' ids.
      "lease_guards: SELECT",
      ...columns("lease_guards", ["alone", "ids", "worker", "xid"], "INSERT"),
      ...columns("lease_guards", ["alone", "ids"], "UPDATE"),
      "lease_guards: DELETE",
    ];
    expect(await privilegesOf(role.worker)).toEqual([...workerRights].sort());
    expect(await privilegesOf(role.expirer)).toEqual(
      [...workerRights, "expire_dead_letters: EXECUTE"].sort(),
    );
    expect(await privilegesOf(role.chainer)).toEqual(
      [...workerRights, ...columns("messages", PRODUCER_INSERT_COLUMNS, "INSERT")].sort(),
    );
    expect(await privilegesOf(role.subscriber)).toEqual(
      [
        ...workerRights,
        ...columns("subscriptions", SUBSCRIBE_COLUMNS, "INSERT"),
        ...columns("subscriptions", SUBSCRIBE_COLUMNS, "SELECT"),
        "topic_matcher: EXECUTE",
      ].sort(),
    );
    const inspectorRights = [
      "schema: USAGE",
      "schema_migrations: SELECT",
      "unprocessed: SELECT",
      "leases: SELECT",
      "batch_leased: EXECUTE",
      "dead_letters: SELECT",
      ...columns("messages", INSPECTOR_SELECT_COLUMNS, "SELECT"),
      "subscriptions: SELECT",
      "topic_queues: EXECUTE",
      "inbox: SELECT",
    ];
    expect(await privilegesOf(role.inspector)).toEqual([...inspectorRights].sort());
    expect(await privilegesOf(role.repairer)).toEqual(
      [
        ...inspectorRights,
        "messages.key: SELECT",
        ...columns("messages", REPAIR_INSERT_COLUMNS, "INSERT"),
        "dead_letters: DELETE",
        "dead_letters.error: UPDATE",
        "route_unrouted: EXECUTE",
      ].sort(),
    );
  });

  it("takes EXECUTE on the schema's functions from PUBLIC", async () => {
    const { rows } = await db.pool.query<{ proname: string }>(
      `SELECT proname FROM pg_proc, aclexplode(COALESCE(proacl, acldefault('f', proowner))) AS a
       WHERE pronamespace = $1::regnamespace AND a.grantee = 0 ORDER BY 1`,
      [schema],
    );
    expect(rows).toEqual([]);
    // The functions that run as their owner are the ones grant hands out: a new one must be given to a
    // side here (and be shown needed), not left to whoever reaches the schema.
    const { rows: definers } = await db.pool.query<{ proname: string }>(
      "SELECT proname FROM pg_proc WHERE pronamespace = $1::regnamespace AND prosecdef ORDER BY 1",
      [schema],
    );
    expect(definers.map((f) => f.proname)).toEqual([
      "batch_leased",
      "cancel",
      "copy_to_queues",
      "dead_letter",
      "dead_letter_announced",
      "expire_dead_letters",
      "expire_inbox",
      "fan_out",
      "route_unrouted",
      "topic_queues",
    ]);
  });
});

describe("upgrading a schema whose rights were granted", () => {
  it("refuses a schema never migrated, naming the fix and granting nothing", async () => {
    const bare = `${schema}_bare`;
    await db.pool.query(`DROP SCHEMA IF EXISTS "${bare}" CASCADE; CREATE SCHEMA "${bare}"`);
    try {
      const owner = { PATH: process.env.PATH, DATABASE_URL: db.url };
      const result = await runCli(["grant", "--schema", bare, "--worker", role.worker], owner);
      expect(result.code).toBe(1);
      expect(result.stderr).toContain(
        `schema "${bare}" is not migrated: run \`outbox-worker migrate --schema ${bare}\` first, then grant`,
      );
      const usage = await db.pool.query<{ ok: boolean }>(
        "SELECT has_schema_privilege($1, $2, 'USAGE') AS ok",
        [role.worker, bare],
      );
      expect(usage.rows[0]?.ok).toBe(false);
    } finally {
      await db.pool.query(`DROP SCHEMA IF EXISTS "${bare}" CASCADE`);
    }
  });

  /** A schema at the shipped migrations up to `version`, dropped after `body`. */
  async function olderSchema(version: number, body: (upgraded: string) => Promise<void>): Promise<void> {
    const upgraded = `${schema}_up`;
    await db.pool.query(`DROP SCHEMA IF EXISTS "${upgraded}" CASCADE`);
    try {
      await migrate({
        connection: db.pool,
        schema: upgraded,
        migrationsDir: await shippedMigrationsUpTo(version),
      });
      await body(upgraded);
    } finally {
      await db.pool.query(`DROP SCHEMA IF EXISTS "${upgraded}" CASCADE`);
    }
  }

  /** `fn` may be called by the worker, not by the producer, and not by PUBLIC. */
  async function expectWorkerOnly(fn: string): Promise<void> {
    const may = async (who: string) =>
      (
        await db.pool.query<{ ok: boolean }>("SELECT has_function_privilege($1, $2, 'EXECUTE') AS ok", [
          who,
          fn,
        ])
      ).rows[0]?.ok;
    expect(await may(role.worker)).toBe(true);
    expect(await may(role.producer)).toBe(false);
    const { rows } = await db.pool.query(
      `SELECT 1 FROM pg_proc, aclexplode(COALESCE(proacl, acldefault('f', proowner))) AS a
       WHERE oid = $1::regprocedure AND a.grantee = 0`,
      [fn],
    );
    expect(rows).toEqual([]);
  }

  it("gives ack_key_heads (migration 0006) to whoever may call ack_keyed, and not to PUBLIC", async () => {
    await olderSchema(5, async (upgraded) => {
      // This version's grant on the older schema: refused before any change, naming the fix.
      const owner = { PATH: process.env.PATH, DATABASE_URL: db.url };
      const early = await runCli(["grant", "--schema", upgraded, "--worker", role.worker], owner);
      expect(early.code).toBe(1);
      expect(early.stderr).toContain(
        `schema "${upgraded}" is older than this version (migrations ${versionsAfter(5).join(", ")} pending): run \`outbox-worker migrate --schema ${upgraded}\` first`,
      );
      const rights = await db.pool.query<{ n: number }>(
        `SELECT count(*)::int AS n FROM information_schema.role_table_grants WHERE grantee = $1 AND table_schema = $2`,
        [role.worker, upgraded],
      );
      expect(rights.rows[0]?.n).toBe(0);
      // What `grant` of the release before 0006 did to the functions.
      await db.pool.query(
        `REVOKE ALL ON ALL FUNCTIONS IN SCHEMA "${upgraded}" FROM PUBLIC;
         GRANT EXECUTE ON FUNCTION "${upgraded}".ack_keyed(bigint[], uuid[], integer, uuid, double precision, text, boolean) TO "${role.worker}"`,
      );
      const result = await migrate({ connection: db.pool, schema: upgraded });
      expect(result.applied.map((m) => m.version)).toEqual(versionsAfter(5));
      await expectWorkerOnly(
        `"${upgraded}".ack_key_heads(bigint[], uuid[], text[], text[], integer, uuid, double precision, text, boolean)`,
      );
    });
  });

  it("gives promote_heads_after (migration 0009) to whoever may call promote_heads, and not to PUBLIC", async () => {
    await olderSchema(8, async (upgraded) => {
      // What `grant` of the release before 0009 did to the functions.
      await db.pool.query(
        `REVOKE ALL ON ALL FUNCTIONS IN SCHEMA "${upgraded}" FROM PUBLIC;
         GRANT EXECUTE ON FUNCTION "${upgraded}".promote_heads(text[], text[], integer, uuid, double precision, text) TO "${role.worker}"`,
      );
      const result = await migrate({ connection: db.pool, schema: upgraded });
      expect(result.applied.map((m) => m.version)).toEqual(versionsAfter(8));
      await expectWorkerOnly(
        `"${upgraded}".promote_heads_after(text[], text[], bigint[], integer, uuid, double precision, text)`,
      );
    });
  });
});

describe("upgrading to copy_to_queues (a function file)", () => {
  it("gives it to whoever may call fan_out: a producer granted before inserts topic rows with no new grant", async () => {
    const upgraded = `${schema}_copies`;
    await db.pool.query(`DROP SCHEMA IF EXISTS "${upgraded}" CASCADE`);
    try {
      // The numbered migrations alone: fan_out and expand_topic as 0012 made them, no copy_to_queues.
      await migrate({
        connection: db.pool,
        schema: upgraded,
        migrationsDir: await shippedMigrationsUpTo(24),
      });
      const s = `"${upgraded}"`;
      // What `grant --producer` of a release before copy_to_queues gave for topics.
      await db.pool.query(`REVOKE ALL ON ALL FUNCTIONS IN SCHEMA ${s} FROM PUBLIC;
        GRANT USAGE ON SCHEMA ${s} TO "${role.producer}";
        GRANT INSERT (${[...PRODUCER_INSERT_COLUMNS, "topic"].join(", ")}),
          SELECT (${PRODUCER_SELECT_COLUMNS.join(", ")}) ON ${s}.messages TO "${role.producer}";
        GRANT EXECUTE ON FUNCTION ${s}.fan_out(text, jsonb, boolean), ${s}.topic_queues(text)
          TO "${role.producer}"`);
      const result = await migrate({ connection: db.pool, schema: upgraded });
      expect(result.functions.applied).toContain("copy_to_queues");
      await subscribe(db.pool, { schema: upgraded, topic: "u.placed", queue: "u.q" });
      const inserted = await producer.query(
        `INSERT INTO ${s}.messages (topic, payload, key) VALUES ('u.placed', '{}', 'k')`,
      );
      expect(inserted.rowCount).toBe(0);
      expect((await db.pool.query(`SELECT queue FROM ${s}.messages`)).rows).toEqual([{ queue: "u.q" }]);
      const may = async (who: string) =>
        (
          await db.pool.query<{ ok: boolean }>("SELECT has_function_privilege($1, $2, 'EXECUTE') AS ok", [
            who,
            `${s}.copy_to_queues(text, text[], jsonb, boolean)`,
          ])
        ).rows[0]?.ok;
      expect(await may(role.worker)).toBe(false);
      expect(await may("public")).toBe(false);
    } finally {
      await db.pool.query(`DROP SCHEMA IF EXISTS "${upgraded}" CASCADE`);
    }
  });
});

describe("upgrading to batch leases (migration 0024)", () => {
  it("gives batch_leased() to the roles that read leases, so status and peek keep working until grant runs again", async () => {
    const upgraded = `${schema}_batches`;
    await db.pool.query(`DROP SCHEMA IF EXISTS "${upgraded}" CASCADE`);
    try {
      await migrate({
        connection: db.pool,
        schema: upgraded,
        migrationsDir: await shippedMigrationsUpTo(23),
      });
      const s = `"${upgraded}"`;
      // What `grant --inspector` of the release before 0024 gave for status.
      await db.pool.query(`GRANT USAGE ON SCHEMA ${s} TO "${role.inspector}", "${role.producer}";
        GRANT SELECT ON ${s}.schema_migrations, ${s}.leases, ${s}.unprocessed, ${s}.dead_letters TO "${role.inspector}";
        GRANT SELECT (${INSPECTOR_SELECT_COLUMNS.join(", ")}) ON ${s}.messages TO "${role.inspector}"`);
      await migrate({ connection: db.pool, schema: upgraded });
      expect(await queueStatus(inspector, upgraded)).toEqual([]);
      expect(await peekMessages(inspector, upgraded, {})).toEqual([]);
      const may = async (who: string) =>
        (
          await db.pool.query<{ ok: boolean }>("SELECT has_function_privilege($1, $2, 'EXECUTE') AS ok", [
            who,
            `${s}.batch_leased()`,
          ])
        ).rows[0]?.ok;
      expect(await may(role.inspector)).toBe(true);
      expect(await may(role.producer)).toBe(false);
    } finally {
      await db.pool.query(`DROP SCHEMA IF EXISTS "${upgraded}" CASCADE`);
    }
  });
});

describe("upgrading to dedupe keys (migration 0017)", () => {
  it("gives cancel and the dedupe_key column to the producers granted before, and to nobody else", async () => {
    const upgraded = `${schema}_dedupe`;
    const p = role.producer;
    await db.pool.query(`DROP SCHEMA IF EXISTS "${upgraded}" CASCADE`);
    try {
      await migrate({
        connection: db.pool,
        schema: upgraded,
        migrationsDir: await shippedMigrationsUpTo(15),
      });
      const s = `"${upgraded}"`;
      // What `grant --producer` of the release before 0017 gave (and took from PUBLIC).
      await db.pool.query(`REVOKE ALL ON ALL FUNCTIONS IN SCHEMA ${s} FROM PUBLIC;
        GRANT USAGE ON SCHEMA ${s} TO "${p}", "${role.worker}";
        GRANT INSERT (queue, payload, headers, key, available_at, topic), SELECT (id, queue, key) ON ${s}.messages TO "${p}";
        GRANT INSERT (queue, payload, headers, key, available_at), SELECT, DELETE ON ${s}.messages TO "${role.chainer}"`);
      await migrate({ connection: db.pool, schema: upgraded });
      const may = async (sql: string, ...args: string[]) =>
        (await db.pool.query<{ ok: boolean }>(`SELECT ${sql} AS ok`, args)).rows[0]?.ok;
      const cancel = `${s}.cancel(text, text)`;
      expect(await may("has_function_privilege($1, $2, 'EXECUTE')", p, cancel)).toBe(true);
      expect(await may("has_column_privilege($1, $2, 'dedupe_key', 'INSERT')", p, `${s}.messages`)).toBe(
        true,
      );
      expect(await may("has_column_privilege($1, $2, 'dedupe_key', 'SELECT')", p, `${s}.messages`)).toBe(
        true,
      );
      // A worker allowed follow-ups inserts messages, but is no producer: nothing new for it.
      expect(await may("has_function_privilege($1, $2, 'EXECUTE')", role.chainer, cancel)).toBe(false);
      expect(await may("has_function_privilege($1, $2, 'EXECUTE')", role.inspector, cancel)).toBe(false);
      const { rows } = await db.pool.query(
        `SELECT 1 FROM pg_proc, aclexplode(COALESCE(proacl, acldefault('f', proowner))) AS a
         WHERE oid = $1::regprocedure AND a.grantee = 0`,
        [cancel],
      );
      expect(rows).toEqual([]);
    } finally {
      await db.pool.query(`DROP SCHEMA IF EXISTS "${upgraded}" CASCADE`);
    }
  });
});

describe("upgrading to the narrower rights (migration 0015)", () => {
  it("keeps roles granted before working until grant runs again, which narrows them", async () => {
    const upgraded = `${schema}_narrow`;
    const w = role.worker;
    const i = role.inspector;
    await db.pool.query(`DROP SCHEMA IF EXISTS "${upgraded}" CASCADE`);
    try {
      await migrate({
        connection: db.pool,
        schema: upgraded,
        migrationsDir: await shippedMigrationsUpTo(14),
      });
      const s = `"${upgraded}"`;
      // What `grant` of the release before 0015 gave.
      await db.pool.query(`REVOKE ALL ON ALL FUNCTIONS IN SCHEMA ${s} FROM PUBLIC;
        GRANT USAGE ON SCHEMA ${s} TO "${w}", "${i}";
        GRANT SELECT, UPDATE, DELETE ON ${s}.messages TO "${w}";
        GRANT SELECT, INSERT, UPDATE ON ${s}.dead_letters TO "${w}";
        GRANT SELECT ON ${s}.schema_migrations TO "${w}";
        GRANT SELECT (id, queue, head, available_at, acquired_at, acquired_token, acquired_by, lease_expires_at)
          ON ${s}.messages TO "${i}";
        GRANT SELECT ON ${s}.unprocessed, ${s}.dead_letters TO "${i}"`);
      expect(
        (await migrate({ connection: db.pool, schema: upgraded })).applied.map((m) => m.version),
      ).toEqual(versionsAfter(14));
      const may = async (sql: string, ...args: string[]) =>
        (await db.pool.query<{ ok: boolean }>(`SELECT ${sql} AS ok`, args)).rows[0]?.ok;
      const move = `${s}.dead_letter(bigint[], uuid[], text[], text[], integer[], integer[], integer, boolean)`;
      // Migration 0018's move with announcements goes to whoever may run the move, and nobody else.
      const announced = `${s}.dead_letter_announced(bigint[], uuid[], text[], text[], integer[], integer[], integer, boolean, text[], text[], text)`;
      expect(await may("has_function_privilege($1, $2, 'EXECUTE')", w, announced)).toBe(true);
      expect(await may("has_function_privilege($1, $2, 'EXECUTE')", i, announced)).toBe(false);
      expect(await may("has_function_privilege($1, $2, 'EXECUTE')", role.producer, announced)).toBe(false);
      const expire = `${s}.expire_dead_letters(double precision, integer)`;
      // The new code's objects, to whoever could do the same before; nobody else, PUBLIC included.
      expect(await may("has_function_privilege($1, $2, 'EXECUTE')", w, move)).toBe(true);
      expect(await may("has_function_privilege($1, $2, 'EXECUTE')", i, move)).toBe(false);
      expect(await may("has_function_privilege($1, $2, 'EXECUTE')", role.producer, move)).toBe(false);
      expect(await may("has_function_privilege($1, $2, 'EXECUTE')", w, expire)).toBe(false);
      expect(await may("has_table_privilege($1, $2, 'SELECT')", w, `${s}.leases`)).toBe(true);
      expect(await may("has_table_privilege($1, $2, 'SELECT')", i, `${s}.leases`)).toBe(true);
      expect(await may("has_table_privilege($1, $2, 'SELECT')", i, `${s}.schema_migrations`)).toBe(true);
      expect(await may("has_table_privilege($1, $2, 'SELECT')", role.producer, `${s}.leases`)).toBe(false);
      // The worker inbox (0016): to roles that may ack, its reading to roles that may read dead letters.
      const expireInbox = `${s}.expire_inbox(double precision, integer)`;
      expect(await may("has_table_privilege($1, $2, 'INSERT')", w, `${s}.inbox`)).toBe(true);
      expect(await may("has_function_privilege($1, $2, 'EXECUTE')", w, expireInbox)).toBe(true);
      expect(await may("has_table_privilege($1, $2, 'SELECT')", i, `${s}.inbox`)).toBe(true);
      expect(await may("has_table_privilege($1, $2, 'INSERT')", i, `${s}.inbox`)).toBe(false);
      expect(await may("has_table_privilege($1, $2, 'SELECT')", role.producer, `${s}.inbox`)).toBe(false);
      expect(await may("has_function_privilege($1, $2, 'EXECUTE')", role.producer, expireInbox)).toBe(false);
      // The old rights stay until grant runs again.
      expect(await may("has_column_privilege($1, $2, 'payload', 'UPDATE')", w, `${s}.messages`)).toBe(true);
      const owner = { PATH: process.env.PATH, DATABASE_URL: db.url };
      const again = await runCli(["grant", "--schema", upgraded, "--worker", w, "--inspector", i], owner);
      expect(again, again.stderr).toMatchObject({ code: 0 });
      expect(await may("has_column_privilege($1, $2, 'payload', 'UPDATE')", w, `${s}.messages`)).toBe(false);
      expect(await may("has_column_privilege($1, $2, 'acquired_token', 'UPDATE')", w, `${s}.messages`)).toBe(
        true,
      );
      expect(await may("has_table_privilege($1, $2, 'INSERT')", w, `${s}.dead_letters`)).toBe(false);
      expect(await may("has_table_privilege($1, $2, 'UPDATE')", w, `${s}.dead_letters`)).toBe(false);
      expect(await may("has_function_privilege($1, $2, 'EXECUTE')", w, move)).toBe(true);
      expect(await may("has_column_privilege($1, $2, 'acquired_token', 'SELECT')", i, `${s}.messages`)).toBe(
        false,
      );
    } finally {
      await db.pool.query(`DROP SCHEMA IF EXISTS "${upgraded}" CASCADE`);
    }
  });
});

describe("producer", () => {
  it("publishes, keyed and not, and reads back only the ids, queues and keys", async () => {
    const client = await producer.connect();
    try {
      await client.query("BEGIN");
      const id = await outbox.publish(client, "p.plain", { n: 1 });
      const keyed = await outbox.publish(client, "p.keyed", { n: 2 }, { key: "k" });
      const second = await outbox.publish(client, "p.keyed", { n: 3 }, { key: "k" });
      const many = await outbox.publishMany(client, "p.many", [
        { payload: { n: 4 }, key: "a" },
        { payload: { n: 5 }, delayMs: 60_000 },
      ]);
      await client.query("COMMIT");
      expect([id, keyed, second, ...many].every((x) => /^\d+$/.test(x))).toBe(true);
    } finally {
      client.release();
    }
    const { rows } = await db.pool.query(
      `SELECT key, head FROM ${names.messages} WHERE queue = 'p.keyed' ORDER BY id`,
    );
    // The key-head trigger ran as the producer: the second row waits behind the first.
    expect(rows).toEqual([
      { key: "k", head: true },
      { key: "k", head: false },
    ]);
    await db.pool.query(`DELETE FROM ${names.messages} WHERE queue LIKE 'p.%'`);
  });

  it("publishes to a topic with publishToTopic and with a plain-SQL INSERT, through fan_out", async () => {
    await subscribe(db.pool, { schema, topic: "p.order.*", queue: "p.billing" });
    await subscribe(db.pool, { schema, topic: "p.order.placed", queue: "p.email" });
    try {
      await publishesToTopics();
    } finally {
      await db.pool.query(`DELETE FROM ${names.messages} WHERE queue LIKE 'p.%'`);
      await db.pool.query(`DELETE FROM ${names.deadLetters} WHERE queue = 'p.nobody'`);
      await db.pool.query(`DELETE FROM ${names.subscriptions} WHERE queue LIKE 'p.%'`);
    }
  });

  async function publishesToTopics(): Promise<void> {
    const client = await producer.connect();
    let event: Awaited<ReturnType<typeof outbox.publishToTopic>>;
    try {
      await client.query("BEGIN");
      event = await outbox.publishToTopic(client, "p.order.placed", { n: 1 }, { key: "o1" });
      // The trigger expands the row through fan_out and stores nothing itself.
      const plain = await client.query(
        `INSERT INTO ${names.messages} (topic, payload, key) VALUES ('p.order.placed', '{"n": 2}', 'o1')`,
      );
      expect(plain.rowCount).toBe(0);
      await client.query("COMMIT");
    } finally {
      // Never back to the pool inside a failed transaction.
      await client.query("ROLLBACK").catch(() => {});
      client.release();
    }
    expect(event.messages.map((m) => m.queue)).toEqual(["p.billing", "p.email"]);
    const { rows } = await db.pool.query(
      `SELECT queue, payload, key, headers ->> 'outbox-topic' AS topic, head FROM ${names.messages}
       WHERE queue IN ('p.billing', 'p.email') ORDER BY queue, id`,
    );
    expect(rows).toEqual([
      { queue: "p.billing", payload: { n: 1 }, key: "o1", topic: "p.order.placed", head: true },
      { queue: "p.billing", payload: { n: 2 }, key: "o1", topic: "p.order.placed", head: false },
      { queue: "p.email", payload: { n: 1 }, key: "o1", topic: "p.order.placed", head: true },
      { queue: "p.email", payload: { n: 2 }, key: "o1", topic: "p.order.placed", head: false },
    ]);
    // It may ask which queues a topic reaches (the same its copies' queues tell it), for its wake-ups.
    expect(await subscribersOf(producer, "p.order.placed", { schema })).toEqual(["p.billing", "p.email"]);
    await run(producer, produceStatements(names).notifyTopic, [names.channel, "p.order.placed"]);
    // No subscriber: kept as a dead letter, written by fan_out; the producer still reads no dead letter.
    expect(await outbox.publishToTopic(producer, "p.nobody", { n: 3 })).toEqual({
      topic: "p.nobody",
      messages: [],
    });
    const kept = await db.pool.query(`SELECT reason FROM ${names.deadLetters} WHERE queue = 'p.nobody'`);
    expect(kept.rows).toEqual([{ reason: "no_subscribers" }]);
  }

  it("is refused subscribing, unsubscribing and reading or writing subscriptions", async () => {
    await subscribe(db.pool, { schema, topic: "p.kept", queue: "p.kept" });
    const sub = names.subscriptions;
    const ops: [string, () => Promise<unknown>][] = [
      ["subscribe", () => subscribe(producer, { schema, topic: "p.#", queue: "p.spy" })],
      ["unsubscribe", () => unsubscribe(producer, { schema, topic: "p.kept", queue: "p.kept" })],
      ["listSubscriptions", () => listSubscriptions(producer, { schema })],
      ...[
        `SELECT * FROM ${sub}`,
        `SELECT pattern, queue FROM ${sub}`,
        `INSERT INTO ${sub} (pattern, queue) VALUES ('p.#', 'p.spy')`,
        `UPDATE ${sub} SET queue = 'p.spy'`,
        `DELETE FROM ${sub}`,
        `TRUNCATE ${sub}`,
        `SELECT * FROM ${names.quotedSchema}.route_unrouted('{}')`,
        `SELECT ${names.quotedSchema}.topic_matcher('p.*')`,
      ].map((sql): [string, () => Promise<unknown>] => [sql, () => producer.query(sql)]),
    ];
    try {
      for (const [what, op] of ops) expect(await refused(op), what).toMatch(/permission denied/);
      const left = await db.pool.query(`SELECT pattern, queue FROM ${sub} WHERE queue LIKE 'p.%'`);
      expect(left.rows).toEqual([{ pattern: "p.kept", queue: "p.kept" }]);
    } finally {
      await db.pool.query(`DELETE FROM ${sub} WHERE queue LIKE 'p.%'`);
    }
  });

  it("reads ids, queues and keys, and is refused status, peek, dead letters and the start-up checks", async () => {
    await producer.query(`SELECT id, queue, key FROM ${names.messages}`);
    for (const args of [["status"], ["peek"], ["dead-letters", "list"]]) {
      const result = await cli(role.producer, args);
      expect(result.code, args.join(" ")).toBe(1);
      expect(result.stderr).toMatch(/permission denied/);
    }
    expect(await refused(() => checkSchema({ pool: producer, schema }))).toMatch(/permission denied/);
  });

  it("is refused payloads, updates, deletes, lease columns, dead letters, functions and DDL", async () => {
    const m = names.messages;
    const attempts = [
      `SELECT payload FROM ${m}`,
      `SELECT * FROM ${m}`,
      `SELECT * FROM ${names.unprocessed}`,
      `SELECT * FROM ${names.deadLetters}`,
      `DELETE FROM ${names.deadLetters}`,
      `SELECT * FROM ${names.migrationsTable}`,
      `UPDATE ${m} SET available_at = now()`,
      `DELETE FROM ${m}`,
      `TRUNCATE ${m}`,
      `INSERT INTO ${m} (queue, payload, acquired_token, acquired_at, lease_expires_at) VALUES ('q', '1', gen_random_uuid(), now(), now())`,
      `INSERT INTO ${m} (queue, payload, head) VALUES ('q', '1', true)`,
      `SELECT * FROM ${names.quotedSchema}.ack_keyed('{}', '{}', 0, gen_random_uuid(), 1, 'w', true)`,
      `SELECT * FROM ${names.quotedSchema}.ack_key_heads('{}', '{}', '{}', '{}', 0, gen_random_uuid(), 1, 'w', true)`,
      `CREATE TABLE ${names.quotedSchema}.mine (x int)`,
    ];
    for (const sql of attempts) {
      expect(await refused(() => producer.query(sql)), sql).toMatch(/permission denied/);
    }
  });
});

describe("worker", () => {
  const workers = workerFactory({ url: urlAs(role.worker), schema });
  const chainers = workerFactory({ url: urlAs(role.chainer), schema });

  it("passes the service's start-up checks", async () => {
    await checkSchema({ pool: worker, schema });
    // The vacuum check reads the table's statistics: it must see them (whether it warns is the server's).
    expect(await tableHealth(worker, schema)).toMatchObject({ total_bytes: expect.any(Number) });
    await warnIfNotVacuumed(worker, schema, { warn: () => {} } as never);
  });

  it.each(["token", "transaction"] as const)(
    "leaseMode %s: drains plain and keyed messages, retries, dead-letters, and repairs key heads and lease guards",
    async (leaseMode) => {
      await db.pool.query(`DELETE FROM ${names.deadLetters} WHERE queue LIKE 'w.%'`);
      const client = await db.pool.connect();
      try {
        await client.query("BEGIN");
        for (let i = 0; i < 5; i++) await outbox.publish(client, "w.plain", { i });
        for (let i = 0; i < 6; i++) await outbox.publish(client, "w.keyed", { i }, { key: `k${i % 2}` });
        await outbox.publish(client, "w.retry", { i: 0 });
        await outbox.publish(client, "w.dead", { i: 0 }, { key: "d" });
        await outbox.publish(client, "w.dead", { i: 1 }, { key: "d" });
        await client.query("COMMIT");
      } finally {
        client.release();
      }
      const seen: string[] = [];
      let failedOnce = false;
      await workers.start({
        leaseMode,
        queues: {
          "w.plain": () => {
            seen.push("plain");
          },
          "w.keyed": () => {
            seen.push("keyed");
          },
          "w.retry": {
            handler: () => {
              if (!failedOnce) {
                failedOnce = true;
                throw new TransientError("once");
              }
              seen.push("retried");
            },
            retry: constant(10),
          },
          "w.dead": (payload) => {
            if ((payload as { i: number }).i === 0) throw new PermanentError("no");
            seen.push("after-dead");
          },
        },
      });
      await until(async () => {
        const { rows } = await db.pool.query(`SELECT count(*)::int AS n FROM ${names.messages}`);
        return rows[0].n === 0;
      }, "every message handled");
      expect(seen.filter((s) => s === "keyed")).toHaveLength(6);
      expect(seen).toEqual(expect.arrayContaining(["plain", "retried", "after-dead"]));
      const dead = await db.pool.query(`SELECT queue, reason FROM ${names.deadLetters}`);
      expect(dead.rows).toEqual([{ queue: "w.dead", reason: "rejected" }]);
      const repaired = await runQuery(worker, repairKeyHeadsStatement(names), { queues: ["w.keyed"] });
      expect(repaired).toEqual([]);
      // The guard repair of transaction-held batches runs under the worker's rights too (it logs, not throws).
      expect(await runQuery(worker, repairGuardsStatement(names), { limit: 10 })).toEqual([
        { counted: 0, cleared: 0 },
      ]);
    },
  );

  it("runs transactional handlers with no right beyond the worker's (and its rights on the handler's own table); follow-ups refused roll back the handler's writes", async () => {
    // The handler's writes run as the worker's role, on the app's table: that right is the app's to give.
    const effects = `"${schema}".tx_effects`;
    await db.pool.query(`CREATE TABLE IF NOT EXISTS ${effects} (message_id bigint)`);
    await db.pool.query(`GRANT INSERT ON ${effects} TO ${role.worker}, ${role.chainer}`);
    await db.inTransaction(async (c) => {
      await outbox.publish(c, "w.tx", { i: 0 });
      for (let i = 0; i < 4; i++) await outbox.publish(c, "w.tx", { i }, { key: `t${i % 2}` });
      await outbox.publish(c, "w.tx-chain", { i: 0 }, { key: "c" });
    });
    const write = async (message: { id: string; transaction: { query: pg.ClientBase["query"] } }) => {
      await message.transaction.query(`INSERT INTO ${effects} (message_id) VALUES ($1)`, [message.id]);
    };
    const w = await workers.start({
      queues: {
        "w.tx": handleInTransaction(async (_p, message) => write(message)),
        // A follow-up the worker's role may not insert: dead-lettered at once, naming the grant, and the
        // handler's write rolled back with the refused ack.
        "w.tx-chain": handleInTransaction(async (p, message) => {
          await write(message);
          return followUp("w.tx-next", p);
        }),
      },
    });
    const dead = await nextEvent<{ queue: string; reason: string; error: string }>(
      w,
      "dead_lettered",
      (e) => e.queue === "w.tx-chain",
    );
    expect(dead.reason).toBe(FOLLOW_UPS_REFUSED);
    expect(dead.error).toContain("--worker-can-follow-up");
    await until(async () => {
      const { rows } = await db.pool.query(`SELECT count(*)::int AS n FROM ${names.messages}`);
      return rows[0].n === 0;
    }, "every transactional message handled");
    const { rows } = await db.pool.query(`SELECT count(*)::int AS n FROM ${effects}`);
    expect(rows[0].n).toBe(5);
  });

  it("announces failures to a queue and to a topic's subscribers, keyed and keyless, without INSERT on messages", async () => {
    await subscribe(db.pool, { schema, topic: "w.failed", queue: "w.failed.sub" });
    await db.inTransaction(async (c) => {
      await outbox.publish(c, "w.ann", { i: 0 }, { key: "a" });
      await outbox.publish(c, "w.ann", { i: 1 }, { key: "a" });
      await outbox.publish(c, "w.ann", { i: 2 });
      await outbox.publish(c, "w.ann.t", { i: 3 });
    });
    const fail = () => {
      throw new PermanentError("no");
    };
    await workers.start({
      queues: {
        "w.ann": { handler: fail, announceFailures: { queue: "w.failures" } },
        "w.ann.t": { handler: fail, announceFailures: { topic: "w.failed" } },
      },
    });
    await until(async () => {
      const { rows } = await db.pool.query(
        `SELECT count(*)::int AS n FROM ${names.messages} WHERE queue IN ('w.ann', 'w.ann.t')`,
      );
      return rows[0].n === 0;
    }, "every announcing message dead-lettered");
    const { rows } = await db.pool.query(
      `SELECT queue, payload ->> 'queue' AS of, (payload ->> 'id')::bigint AS id FROM ${names.messages}
       WHERE queue IN ('w.failures', 'w.failed.sub') ORDER BY 3`,
    );
    const dead = await db.pool.query(
      `SELECT id, queue FROM ${names.deadLetters} WHERE queue IN ('w.ann', 'w.ann.t') ORDER BY id`,
    );
    expect(rows).toEqual(
      dead.rows.map((d) => ({
        queue: d.queue === "w.ann" ? "w.failures" : "w.failed.sub",
        of: d.queue,
        id: d.id,
      })),
    );
    expect(rows).toHaveLength(4);
    await db.pool.query(
      `DELETE FROM ${names.messages} WHERE queue IN ('w.failures', 'w.failed.sub');
       DELETE FROM ${names.deadLetters} WHERE queue IN ('w.ann', 'w.ann.t')`,
    );
    await unsubscribe(db.pool, { schema, topic: "w.failed", queue: "w.failed.sub" });
  });

  it("reads status, dead letters and the replay preview through the CLI; refused peek (the view), replay and purge", async () => {
    await cliOk(role.worker, ["status"]);
    await cliOk(role.worker, ["dead-letters", "list"]);
    await cliOk(role.worker, ["dead-letters", "replay", "--all", "--dry-run"]);
    for (const args of [
      ["peek"],
      ["dead-letters", "replay", "--all"],
      ["dead-letters", "purge", "--older-than", "1s"],
    ]) {
      const result = await cli(role.worker, args);
      expect(result.code, args.join(" ")).toBe(1);
      expect(result.stderr, args.join(" ")).toMatch(/permission denied/);
    }
  });

  it("runs the service (`outbox-worker run`, dead-letter retention on with --worker-can-expire) and stops cleanly", async () => {
    for (const [name, canExpire] of [
      [role.worker, false],
      [role.expirer, true],
    ] as const) {
      await db.pool.query(
        `INSERT INTO ${names.deadLetters} (id, queue, payload, headers, created_at, available_at, deliveries_count, attempts_count, dead_at, reason)
         VALUES (900100, 'fast', '{}', '{}', now(), now(), 1, 1, now() - interval '2 days', 'rejected')
         ON CONFLICT (id) DO NOTHING`,
      );
      const p = startCli(
        ["run", "--handlers", path.resolve("test/support/fixtures/handlers.ts"), "--http-port", "0"],
        serviceEnv(
          { url: urlAs(name), schema },
          canExpire ? { OUTBOX_DEAD_LETTER_RETENTION_MS: "3600000" } : {},
        ),
      );
      try {
        await p.waitFor("outbox-worker running");
        const client = await db.pool.connect();
        try {
          await outbox.publish(client, "fast", { n: 1 }, { key: "s" });
        } finally {
          client.release();
        }
        await until(async () => {
          const { rows } = await db.pool.query(`SELECT count(*)::int AS n FROM ${names.messages}`);
          return rows[0].n === 0;
        }, "the service handled the message");
        if (canExpire) {
          await until(
            async () => {
              const { rows } = await db.pool.query(
                `SELECT count(*)::int AS n FROM ${names.deadLetters} WHERE id = 900100`,
              );
              return rows[0].n === 0;
            },
            "retention deleted the old dead letter",
            90_000,
          );
        }
        p.child.kill("SIGTERM");
        expect((await p.exited).code, p.output()).toBe(0);
        if (canExpire) expect(p.output()).not.toMatch(/permission denied/);
      } finally {
        if (p.child.exitCode === null) p.child.kill("SIGKILL");
      }
    }
  }, 120_000);

  it("refuses to start when a configured feature lacks its right, naming the grant option", async () => {
    const features: [Record<string, string>, string][] = [
      [{ OUTBOX_DEAD_LETTER_RETENTION_MS: "3600000" }, "--worker-can-expire"],
      [{ OUTBOX_SUBSCRIPTIONS: JSON.stringify({ fast: ["w.start.topic"] }) }, "--worker-can-subscribe"],
    ];
    for (const [env, option] of features) {
      const p = startCli(
        ["run", "--handlers", path.resolve("test/support/fixtures/handlers.ts"), "--http-port", "0"],
        serviceEnv({ url: urlAs(role.worker), schema }, env),
      );
      try {
        // Fails fast either way: a service that starts is not waited out.
        const started = await p.waitFor("outbox-worker running").then(
          () => true,
          () => false,
        );
        expect(started, p.output()).toBe(false);
        expect((await p.exited).code, p.output()).toBe(1);
        expect(p.output()).toContain(
          `\`outbox-worker grant --worker ${role.worker} ${option} --schema ${schema}\``,
        );
        expect(p.output()).not.toContain("outbox-worker running");
        expect(p.output()).not.toContain(ROLE_PASSWORD);
      } finally {
        if (p.child.exitCode === null) p.child.kill("SIGKILL");
      }
    }
    // The follow-up right cannot be required (handlers may never return one): said once, at start.
    const p = startCli(
      ["run", "--handlers", path.resolve("test/support/fixtures/handlers.ts"), "--http-port", "0"],
      serviceEnv({ url: urlAs(role.worker), schema }, {}),
    );
    try {
      await p.waitFor("outbox-worker running");
      expect(p.output()).toContain(`grant --worker ${role.worker} --worker-can-follow-up allows them`);
      p.child.kill("SIGTERM");
      expect((await p.exited).code, p.output()).toBe(0);
    } finally {
      if (p.child.exitCode === null) p.child.kill("SIGKILL");
    }
  }, 60_000);

  it("a right taken away while running is logged with the command that gives it back", async () => {
    const logged = memoryLogger();
    const denied = () => logged.lines.find((l) => l.msg.includes("lacks a right"));
    await db.pool.query(`REVOKE DELETE ON ${names.messages} FROM "${role.worker}"`);
    try {
      await db.inTransaction((c) => outbox.publish(c, "w.revoked", { n: 1 }));
      await workers.start({ queues: { "w.revoked": () => {} }, logger: logged.logger });
      await until(() => denied() !== undefined, "the refused ack logged");
      expect(denied()?.msg).toContain("run `outbox-worker grant --worker <role>` with the role's options");
    } finally {
      await db.pool.query(`GRANT DELETE ON ${names.messages} TO "${role.worker}"`);
    }
    await until(async () => {
      const { rows } = await db.pool.query(`SELECT 1 FROM ${names.messages} WHERE queue = 'w.revoked'`);
      return rows.length === 0;
    }, "acked once the right is back");
  });

  it("retention refused at run time says once which grant option gives the right", async () => {
    const logged = memoryLogger();
    const retention = createDeadLetterRetention({
      pool: worker,
      schema,
      retentionMs: 3_600_000,
      logger: logged.logger,
    });
    for (let run = 0; run < 3; run++) {
      const result = await retention.runOnce();
      expect((result.error as { code?: string }).code).toBe("42501");
    }
    await retention.stop();
    const said = logged.lines.filter((l) => l.level >= 40);
    expect(said).toHaveLength(1);
    expect(said[0]?.msg).toContain("--worker-can-expire");
  });

  it("inserts its handlers' follow-ups only with --worker-can-follow-up; without it the message is dead-lettered at once, naming the grant", async () => {
    await db.inTransaction(async (c) => {
      await outbox.publish(c, "w.step1", { n: 1 });
      await outbox.publish(c, "w.plain2", { n: 2 });
    });
    const step = { "w.step1": (p: unknown) => followUp("w.step2", p), "w.plain2": () => {} };
    const plain = await workers.start({ queues: step });
    // Not left to cycle through lease expiry until max_deliveries: dead at its first delivery, saying why.
    const dead = await nextEvent<{ queue: string; reason: string; error: string }>(
      plain,
      "dead_lettered",
      (e) => e.queue === "w.step1",
    );
    expect(dead.reason).toBe(FOLLOW_UPS_REFUSED);
    expect(dead.error).toContain("--worker-can-follow-up");
    // The other acks go on.
    await until(async () => {
      const { rows } = await db.pool.query(`SELECT 1 FROM ${names.messages} WHERE queue = 'w.plain2'`);
      return rows.length === 0;
    }, "the message without follow-ups acked");
    await plain.stop({ timeoutMs: 2000 });
    // Nothing half-done: no follow-up exists, and the parent is a dead letter delivered once.
    const left = await db.pool.query(`SELECT queue FROM ${names.messages} WHERE queue LIKE 'w.step%'`);
    expect(left.rows).toEqual([]);
    const kept = await db.pool.query(
      `SELECT reason, deliveries_count, payload FROM ${names.deadLetters} WHERE queue = 'w.step1'`,
    );
    expect(kept.rows).toEqual([{ reason: FOLLOW_UPS_REFUSED, deliveries_count: 1, payload: { n: 1 } }]);

    // Granted (the chainer role), the replayed message runs again and its follow-up goes in with its ack.
    expect((await replayDeadLetters(db.pool, schema, { queue: "w.step1" })).replayed).toBe(1);
    await chainers.start({ queues: step });
    await until(async () => {
      const { rows } = await db.pool.query(`SELECT queue FROM ${names.messages} WHERE queue LIKE 'w.step%'`);
      return rows.length === 1 && rows[0].queue === "w.step2";
    }, "the parent acked and its follow-up inserted by the chainer role");
  });

  it("without --worker-can-subscribe, holds no right on subscriptions or topics but asking where a topic goes", async () => {
    // topic_queues, for the replay preview: queue names, which the worker reads in every message anyway.
    expect(await subscribersOf(worker, "w.x", { schema })).toEqual([]);
    const sub = names.subscriptions;
    const ops: [string, () => Promise<unknown>][] = [
      ["subscribe", () => subscribe(worker, { schema, topic: "w.#", queue: "w.spy" })],
      ["unsubscribe", () => unsubscribe(worker, { schema, topic: "w.#", queue: "w.spy" })],
      ["listSubscriptions", () => listSubscriptions(worker, { schema })],
      ["publishToTopic", () => outbox.publishToTopic(worker, "w.x", { n: 1 })],
      ...[
        `SELECT pattern, queue FROM ${sub}`,
        `INSERT INTO ${sub} (pattern, queue) VALUES ('w.#', 'w.spy')`,
        `DELETE FROM ${sub}`,
        `INSERT INTO ${names.messages} (topic, payload) VALUES ('w.x', '1')`,
        `SELECT * FROM ${names.quotedSchema}.route_unrouted('{}')`,
      ].map((sql): [string, () => Promise<unknown>] => [sql, () => worker.query(sql)]),
    ];
    for (const [what, op] of ops) expect(await refused(op), what).toMatch(/permission denied/);
    // Follow-ups go to queues: the chainer's INSERT covers no topic row.
    expect(
      await refused(() =>
        poolAs(role.chainer).query(`INSERT INTO ${names.messages} (topic, payload) VALUES ('w.x', '1')`),
      ),
    ).toMatch(/permission denied/);
  });

  it("with --worker-can-subscribe, adds subscriptions idempotently and changes or removes none", async () => {
    const target = { schema, topic: "w.order.*", queue: "w.subscribed" };
    try {
      await subscriberAddsOnly(target);
    } finally {
      await unsubscribe(db.pool, target);
    }
  });

  async function subscriberAddsOnly(target: { schema: string; topic: string; queue: string }): Promise<void> {
    expect(await subscribe(subscriber, target)).toEqual({ created: true });
    expect(await subscribe(subscriber, target)).toEqual({ created: false });
    const sub = names.subscriptions;
    const ops: [string, () => Promise<unknown>][] = [
      ["unsubscribe", () => unsubscribe(subscriber, target)],
      // It reads (pattern, queue), which its ON CONFLICT needs; not the rest of the table.
      ["listSubscriptions", () => listSubscriptions(subscriber, { schema })],
      ["publishToTopic", () => outbox.publishToTopic(subscriber, "w.order.placed", { n: 1 })],
      ...[
        `UPDATE ${sub} SET queue = 'w.spy'`,
        `DELETE FROM ${sub}`,
        `TRUNCATE ${sub}`,
        `SELECT created_at FROM ${sub}`,
        `INSERT INTO ${sub} (pattern, queue, created_at) VALUES ('w.#', 'w.spy', now())`,
        `INSERT INTO ${names.messages} (topic, payload) VALUES ('w.order.placed', '1')`,
      ].map((sql): [string, () => Promise<unknown>] => [sql, () => subscriber.query(sql)]),
    ];
    for (const [what, op] of ops) expect(await refused(op), what).toMatch(/permission denied/);
    expect(await listSubscriptions(db.pool, { schema, queue: "w.subscribed" })).toEqual([
      { topic: "w.order.*", queue: "w.subscribed", createdAt: expect.any(Date) },
    ]);
    expect(await listSubscriptions(db.pool, { schema, queue: "w.spy" })).toEqual([]);
  }

  it("cannot rewrite what it delivers or forge a dead letter: it moves only rows it holds, with their own content", async () => {
    const id = await db.inTransaction((c) => outbox.publish(c, "w.forge", { real: true }, { key: "f" }));
    const m = names.messages;
    const dl = names.deadLetters;
    for (const sql of [
      `UPDATE ${m} SET payload = '{"forged": true}' WHERE id = ${id}`,
      `UPDATE ${m} SET queue = 'w.elsewhere' WHERE id = ${id}`,
      `UPDATE ${m} SET headers = '{"x": "1"}' WHERE id = ${id}`,
      `UPDATE ${m} SET key = 'other' WHERE id = ${id}`,
      `UPDATE ${m} SET created_at = now() WHERE id = ${id}`,
      `UPDATE ${m} SET topic = 'w.t' WHERE id = ${id}`,
      `INSERT INTO ${dl} (id, queue, payload, headers, created_at, available_at, deliveries_count, attempts_count, dead_at, reason)
       VALUES (900200, 'w.forge', '{"forged": true}', '{}', now(), now(), 0, 0, now(), 'rejected')`,
      `UPDATE ${dl} SET payload = '{"forged": true}'`,
      `UPDATE ${dl} SET error = 'x'`,
      `DELETE FROM ${dl}`,
    ]) {
      expect(await refused(() => worker.query(sql)), sql).toMatch(/permission denied/);
    }
    // What it may write: the lease and bookkeeping columns (a lease taken by hand here).
    const token = randomUUID();
    await worker.query(
      `UPDATE ${m} SET acquired_token = $1, acquired_at = now(), lease_expires_at = now() + interval '1 minute',
         last_error = 'bookkeeping' WHERE id = $2`,
      [token, id],
    );
    const complete = completeStatements(names, { synchronousCommit: true });
    const move = (tokens: string[], reasons: string[]) =>
      runQuery(worker, complete.deadKeyed, {
        ids: [id],
        tokens,
        reasons,
        errors: ["the handler said no"],
        attempted: [1],
        failed: [1],
        maxErrorLength: 100,
      });
    // Under another token nothing moves (fenced); the reason fan_out keeps for itself is refused.
    expect(await move([randomUUID()], ["rejected"])).toEqual([
      { keys: [], busy: [], head_queues: [], head_keys: [] },
    ]);
    expect(await refused(() => move([token], ["no_subscribers"]))).toMatch(/no_subscribers/);
    expect(await move([token], ["rejected"])).toEqual([
      { keys: null, busy: [], head_queues: ["w.forge"], head_keys: ["f"] },
    ]);
    const { rows } = await db.pool.query(
      `SELECT queue, payload, key, reason, error, attempts_count FROM ${dl} WHERE id = $1`,
      [id],
    );
    expect(rows).toEqual([
      {
        queue: "w.forge",
        payload: { real: true },
        key: "f",
        reason: "rejected",
        error: "the handler said no",
        attempts_count: 1,
      },
    ]);
    await db.pool.query(`DELETE FROM ${dl} WHERE id = $1`, [id]);
  });

  it("is refused inserts, dead-letter deletes, migrations writes and every DDL", async () => {
    const m = names.messages;
    const attempts = [
      `INSERT INTO ${m} (queue, payload) VALUES ('q', '1')`,
      `DELETE FROM ${names.deadLetters}`,
      `INSERT INTO ${names.migrationsTable} (version, name, checksum) VALUES (99, 'x', 'x')`,
      `TRUNCATE ${m}`,
      `TRUNCATE ${names.deadLetters}`,
      `CREATE TABLE ${names.quotedSchema}.mine (x int)`,
      `ALTER TABLE ${m} ADD COLUMN x int`,
      `DROP TABLE ${names.deadLetters}`,
      `CREATE INDEX ON ${m} (queue)`,
      `ALTER TABLE ${m} DISABLE TRIGGER messages_key_head`,
    ];
    for (const sql of attempts) {
      expect(await refused(() => worker.query(sql)), sql).toMatch(/permission denied|must be owner/);
    }
  });
});

describe("inspector", () => {
  beforeAll(async () => {
    await db.pool.query(`DELETE FROM ${names.deadLetters}`);
    const client = await db.pool.connect();
    try {
      await outbox.publish(client, "i.q", { secret: 1 }, { key: "k" });
      await client.query(
        `INSERT INTO ${names.deadLetters} (id, queue, payload, headers, created_at, available_at, deliveries_count, attempts_count, dead_at, reason)
         VALUES (900001, 'i.q', '{}', '{}', now(), now(), 1, 1, now() - interval '2 days', 'rejected'),
                (900002, 'i.q', '{}', '{}', now(), now(), 1, 1, now() - interval '2 days', 'rejected')`,
      );
      // An event no queue subscribes to yet: kept as a dead letter `no_subscribers`.
      await outbox.publishToTopic(client, "i.unrouted", { n: 1 });
      await subscribe(client, { schema, topic: "i.#", queue: "i.sub" });
    } finally {
      client.release();
    }
  });

  it("reads status, peek and dead letters through the CLI", async () => {
    expect(await cliOk(role.inspector, ["status"])).toContain("i.q");
    // The version check every command makes first: versions, names and checksums only.
    await inspector.query(`SELECT version FROM ${names.migrationsTable}`);
    // Who holds leases, without their tokens.
    const leases = await inspector.query(`SELECT * FROM ${names.leases} LIMIT 0`);
    expect(leases.fields.map((f) => f.name)).toEqual([
      "id",
      "queue",
      "acquired_at",
      "acquired_by",
      "lease_expires_at",
    ]);
    expect(await cliOk(role.inspector, ["peek", "--json"])).toContain("secret");
    expect(await cliOk(role.inspector, ["dead-letters", "list"])).toContain("900001");
    expect(await cliOk(role.inspector, ["dead-letters", "show", "900001"])).toContain("rejected");
    const preview = await cliOk(role.inspector, ["dead-letters", "replay", "--all", "--dry-run"]);
    expect(preview).toContain("i.q");
    // The kept event, counted against the topic's subscribers of now (topic_queues).
    expect(preview).toContain("i.unrouted");
    expect(await listSubscriptions(inspector, { schema, queue: "i.sub" })).toEqual([
      { topic: "i.#", queue: "i.sub", createdAt: expect.any(Date) },
    ]);
    expect(await subscribersOf(inspector, "i.unrouted", { schema })).toEqual(["i.sub"]);
  });

  it("without repair, is refused replay, purge, payloads of messages and every write", async () => {
    for (const args of [
      ["dead-letters", "replay", "--id", "900001"],
      ["dead-letters", "purge", "--older-than", "1d"],
    ]) {
      const result = await cli(role.inspector, args);
      expect(result.code, args.join(" ")).toBe(1);
      // Checked before anything runs, naming the option that gives the right.
      expect(result.stderr).toContain(`permission denied: the user (${role.inspector}) needs `);
      expect(result.stderr).toContain(`DELETE ON ${names.deadLetters}`);
      expect(result.stderr).toContain(
        `run \`outbox-worker grant --inspector ${role.inspector} --inspector-can-repair --schema ${schema}\``,
      );
    }
    for (const sql of [
      `SELECT payload FROM ${names.messages}`,
      // The token fences a worker's writes: nobody but the worker reads it.
      `SELECT acquired_token FROM ${names.messages}`,
      `SELECT * FROM ${names.quotedSchema}.dead_letter('{}', '{}', '{}', '{}', '{}', '{}', 1, true)`,
      `SELECT * FROM ${names.quotedSchema}.dead_letter_announced('{}', '{}', '{}', '{}', '{}', '{}', 1, true, '{}', '{}', 'c')`,
      `SELECT * FROM ${names.quotedSchema}.expire_dead_letters(0, 10)`,
      `UPDATE ${names.messages} SET available_at = now()`,
      `DELETE FROM ${names.messages}`,
      `INSERT INTO ${names.messages} (queue, payload) VALUES ('q', '1')`,
      `UPDATE ${names.deadLetters} SET error = 'x'`,
      `DELETE FROM ${names.deadLetters}`,
      `SELECT * FROM ${names.quotedSchema}.ack_keyed('{}', '{}', 0, gen_random_uuid(), 1, 'w', true)`,
      `SELECT * FROM ${names.quotedSchema}.ack_key_heads('{}', '{}', '{}', '{}', 0, gen_random_uuid(), 1, 'w', true)`,
      `TRUNCATE ${names.deadLetters}`,
      `CREATE TABLE ${names.quotedSchema}.mine (x int)`,
      `INSERT INTO ${names.subscriptions} (pattern, queue) VALUES ('#', 'i.spy')`,
      `UPDATE ${names.subscriptions} SET queue = 'i.spy'`,
      `DELETE FROM ${names.subscriptions}`,
      `SELECT * FROM ${names.quotedSchema}.fan_out('i.x', '[{"payload": 1}]')`,
      `SELECT * FROM ${names.quotedSchema}.route_unrouted(ARRAY(SELECT id FROM ${names.deadLetters}))`,
      `INSERT INTO ${names.messages} (topic, payload) VALUES ('i.x', '1')`,
    ]) {
      expect(await refused(() => inspector.query(sql)), sql).toMatch(/permission denied/);
    }
    for (const op of [
      () => subscribe(inspector, { schema, topic: "#", queue: "i.spy" }),
      () => unsubscribe(inspector, { schema, topic: "i.#", queue: "i.sub" }),
    ]) {
      expect(await refused(op)).toMatch(/permission denied/);
    }
    const left = await db.pool.query(`SELECT count(*)::int AS n FROM ${names.deadLetters}`);
    expect(left.rows[0].n).toBe(3);
    expect(await listSubscriptions(db.pool, { schema, queue: "i.sub" })).toHaveLength(1);
    expect(await listSubscriptions(db.pool, { schema, queue: "i.spy" })).toEqual([]);
  });

  it("with --inspector-can-repair, replays and purges dead letters", async () => {
    expect(await cliOk(role.repairer, ["dead-letters", "replay", "--id", "900001"])).toMatch(/1/);
    const back = await db.pool.query(`SELECT queue FROM ${names.messages} WHERE id = 900001`);
    expect(back.rows).toEqual([{ queue: "i.q" }]);
    // The kept topic event goes to the queue subscribed since (route_unrouted, as the schema's owner).
    expect(await cliOk(role.repairer, ["dead-letters", "replay", "--reason", "no_subscribers"])).toMatch(/1/);
    const routed = await db.pool.query(
      `SELECT queue, headers ->> 'outbox-topic' AS topic FROM ${names.messages} WHERE queue = 'i.sub'`,
    );
    expect(routed.rows).toEqual([{ queue: "i.sub", topic: "i.unrouted" }]);
    expect(await listSubscriptions(repairer, { schema, queue: "i.sub" })).toHaveLength(1);
    expect(await subscribersOf(repairer, "i.unrouted", { schema })).toEqual(["i.sub"]);
    expect(await cliOk(role.repairer, ["dead-letters", "purge", "--older-than", "1d"])).toMatch(/1/);
    const left = await db.pool.query(`SELECT count(*)::int AS n FROM ${names.deadLetters}`);
    expect(left.rows[0].n).toBe(0);
    // Replay's INSERT covers a producer's columns: a repairer can publish too (said in the docs).
    await outbox.publish(repairer, "i.published", { n: 1 }, { key: "k" });
    await db.pool.query(`DELETE FROM ${names.messages} WHERE queue = 'i.published'`);
    // Repair moves dead letters back; it still writes nothing else.
    for (const sql of [
      `SELECT payload FROM ${names.messages}`,
      `UPDATE ${names.messages} SET available_at = now()`,
      `DELETE FROM ${names.messages}`,
      `INSERT INTO ${names.messages} (queue, payload, acquired_token, acquired_at, lease_expires_at) VALUES ('q', '1', gen_random_uuid(), now(), now())`,
      `SELECT * FROM ${names.quotedSchema}.ack_keyed('{}', '{}', 0, gen_random_uuid(), 1, 'w', true)`,
      `SELECT * FROM ${names.quotedSchema}.ack_key_heads('{}', '{}', '{}', '{}', 0, gen_random_uuid(), 1, 'w', true)`,
      `TRUNCATE ${names.deadLetters}`,
      `CREATE TABLE ${names.quotedSchema}.mine (x int)`,
      `INSERT INTO ${names.subscriptions} (pattern, queue) VALUES ('#', 'i.spy')`,
      `DELETE FROM ${names.subscriptions}`,
      `SELECT * FROM ${names.quotedSchema}.fan_out('i.x', '[{"payload": 1}]')`,
      `INSERT INTO ${names.messages} (topic, payload) VALUES ('i.x', '1')`,
    ]) {
      expect(await refused(() => repairer.query(sql)), sql).toMatch(/permission denied/);
    }
  });
});

/**
 * Each right, taken away alone, breaks an operation of its side: none is there for nothing. The operations
 * run with empty inputs where they can (privileges are checked before any row is read).
 */
describe("every right is needed", () => {
  const settings = { synchronousCommit: true };
  const complete = completeStatements(names, settings);
  const none = { ids: [], tokens: [] };
  const token = randomUUID();
  const publishKeyed = async () => {
    const client = await producer.connect();
    try {
      await client.query("BEGIN");
      await outbox.publish(client, "n.q", { n: 1 }, { key: "k" });
    } finally {
      await client.query("ROLLBACK");
      client.release();
    }
  };
  const lease = () =>
    runQuery(worker, fetchStatement(names, settings), {
      queues: ["n.q"],
      limit: 1,
      token,
      leaseTtlMs: 1000,
      workerId: "w",
    });
  const retry = () =>
    runQuery(worker, complete.retry, { ...none, delaysMs: [], errors: [], failed: [], maxErrorLength: 100 });
  const repairHeads = () => runQuery(worker, repairKeyHeadsStatement(names), { queues: ["n.q"] });
  const LEASE_COLUMNS = new Set([
    "acquired_token",
    "acquired_at",
    "lease_expires_at",
    "acquired_by",
    "deliveries_count",
  ]);
  const dead = () =>
    runQuery(worker, complete.dead, {
      ...none,
      reasons: [],
      errors: [],
      attempted: [],
      failed: [],
      maxErrorLength: 100,
    });
  const deadAnnounced = () =>
    runQuery(worker, complete.deadAnnounced, {
      ...none,
      reasons: [],
      errors: [],
      attempted: [],
      failed: [],
      maxErrorLength: 100,
      announceQueues: [],
      announceTopics: [],
      channel: names.channel,
    });
  const ackKeyed = () =>
    runQuery(worker, complete.ackKeyed, { ...none, limit: 0, token, leaseTtlMs: 1000, workerId: "w" });
  const promote = () =>
    runQuery(worker, complete.promote, {
      queues: [],
      keys: [],
      limit: 0,
      token,
      leaseTtlMs: 1000,
      workerId: "w",
    });
  const ackKeyHeads = () =>
    runQuery(worker, complete.ackKeyHeads, {
      ...none,
      queues: "{}",
      keys: "{}",
      limit: 0,
      token,
      leaseTtlMs: 1000,
      workerId: "w",
    });
  // The statements themselves, not the CLI: its start-up check would refuse any right of its list, needed
  // by the statement or not.
  const inspectorReads = async () => {
    await queueStatus(inspector, schema);
    await replayDeadLetters(inspector, schema, { all: true }, { dryRun: true });
  };
  const repairerReplay = async () => {
    await db.pool.query(
      `INSERT INTO ${names.deadLetters} (id, queue, payload, headers, key, created_at, available_at, deliveries_count, attempts_count, dead_at, reason)
       VALUES (900003, 'n.q', '{}', '{}', 'k', now(), now(), 1, 1, now(), 'rejected')`,
    );
    try {
      await replayDeadLetters(repairer, schema, { ids: ["900003"] });
    } finally {
      await db.pool.query(`DELETE FROM ${names.deadLetters} WHERE id = 900003`);
      await db.pool.query(`DELETE FROM ${names.messages} WHERE id = 900003`);
    }
  };
  const inProducerTransaction = async (op: (client: pg.PoolClient) => Promise<unknown>) => {
    const client = await producer.connect();
    try {
      await client.query("BEGIN");
      await op(client);
    } finally {
      await client.query("ROLLBACK");
      client.release();
    }
  };
  const topicEvent = () => inProducerTransaction((c) => outbox.publishToTopic(c, "n.topic", { n: 1 }));
  // A keyed message published with a dedupe key, published again (the no-op), then cancelled: its
  // successor-less head goes, all as the producer.
  const publishDeduped = () =>
    inProducerTransaction(async (c) => {
      const first = await outbox.publish(c, "n.q", { n: 1 }, { key: "k", dedupeKey: "d" });
      const again = await outbox.publish(c, "n.q", { n: 2 }, { key: "k", dedupeKey: "d" });
      if (!again.deduplicated || again.id !== first.id)
        throw new Error(`not deduplicated: ${JSON.stringify(again)}`);
    });
  const cancelDeduped = () =>
    inProducerTransaction(async (c) => {
      await outbox.publish(c, "n.q", { n: 1 }, { key: "k", dedupeKey: "c" });
      const result = await outbox.cancel(c, "n.q", "c");
      if (result.status !== "cancelled") throw new Error(`not cancelled: ${JSON.stringify(result)}`);
    });
  const topicRow = () =>
    inProducerTransaction((c) =>
      c.query(`INSERT INTO ${names.messages} (topic, payload, key) VALUES ('n.topic', '1', 'k')`),
    );
  // What the trailing wake-up of a publisher with its own notify connection runs.
  const topicWake = () => run(producer, produceStatements(names).notifyTopic, [names.channel, "n.topic"]);
  const repairerRoute = async () => {
    await subscribe(db.pool, { schema, topic: "n.routed", queue: "n.routed.q" });
    await db.pool.query(
      `INSERT INTO ${names.deadLetters} (id, queue, payload, headers, created_at, available_at, deliveries_count, attempts_count, dead_at, reason)
       VALUES (900004, 'n.routed', '{}', '{"outbox-topic": "n.routed"}', now(), now(), 0, 0, now(), 'no_subscribers')`,
    );
    try {
      const out = await replayDeadLetters(repairer, schema, { ids: ["900004"] });
      const { rows } = await db.pool.query(`SELECT 1 FROM ${names.messages} WHERE queue = 'n.routed.q'`);
      if (rows.length !== 1)
        throw new Error(`expected one routed copy, got ${rows.length}: ${JSON.stringify(out)}`);
    } finally {
      await db.pool.query(`DELETE FROM ${names.deadLetters} WHERE id = 900004`);
      await db.pool.query(`DELETE FROM ${names.messages} WHERE queue = 'n.routed.q'`);
    }
  };
  const subscribeAtStart = async () => {
    const target = { schema, topic: "n.sub.*", queue: "n.sub.q" };
    try {
      // Twice: the second meets the first in ON CONFLICT.
      await subscribe(subscriber, target);
      await subscribe(subscriber, target);
    } finally {
      await unsubscribe(db.pool, target);
    }
  };
  const m = names.messages;
  const dl = names.deadLetters;
  const fn = (sig: string) => `FUNCTION ${names.quotedSchema}.${sig}`;
  const cases: { right: string; of: string; op: () => Promise<unknown> }[] = [
    { right: `USAGE ON SCHEMA ${names.quotedSchema}`, of: role.producer, op: publishKeyed },
    ...PRODUCER_INSERT_COLUMNS.map((c) => ({
      right: `INSERT (${c}) ON ${m}`,
      of: role.producer,
      op: publishKeyed,
    })),
    ...PRODUCER_SELECT_COLUMNS.map((c) => ({
      right: `SELECT (${c}) ON ${m}`,
      of: role.producer,
      op: publishKeyed,
    })),
    { right: `INSERT (topic) ON ${m}`, of: role.producer, op: topicRow },
    // The dedupe key is written, and read back by ON CONFLICT's arbiter and the pending message's look-up.
    ...PRODUCER_DEDUPE_COLUMNS.flatMap((c) => [
      { right: `INSERT (${c}) ON ${m}`, of: role.producer, op: publishDeduped },
      { right: `SELECT (${c}) ON ${m}`, of: role.producer, op: publishDeduped },
    ]),
    { right: `EXECUTE ON ${fn("cancel(text, text)")}`, of: role.producer, op: cancelDeduped },
    { right: `EXECUTE ON ${fn("fan_out(text, jsonb, boolean)")}`, of: role.producer, op: topicEvent },
    // The topic row's trigger reads the subscribers and writes the copies as the inserting role.
    { right: `EXECUTE ON ${fn("topic_queues(text)")}`, of: role.producer, op: topicRow },
    {
      right: `EXECUTE ON ${fn("copy_to_queues(text, text[], jsonb, boolean)")}`,
      of: role.producer,
      op: topicRow,
    },
    { right: `EXECUTE ON ${fn("topic_queues(text)")}`, of: role.producer, op: topicWake },
    {
      right: `USAGE ON SCHEMA ${names.quotedSchema}`,
      of: role.worker,
      op: () => checkSchema({ pool: worker, schema }),
    },
    { right: `SELECT ON ${m}`, of: role.worker, op: lease },
    // Each column the worker may update, by the statement that writes it.
    ...WORKER_UPDATE_COLUMNS.map((c) => ({
      right: `UPDATE (${c}) ON ${m}`,
      of: role.worker,
      op: LEASE_COLUMNS.has(c) ? lease : c === "head" ? repairHeads : retry,
    })),
    { right: `DELETE ON ${m}`, of: role.worker, op: () => runQuery(worker, complete.ack, none) },
    { right: `SELECT ON ${dl}`, of: role.worker, op: () => runQuery(worker, complete.whereabouts, none) },
    // The move writes dead letters as the schema's owner: the worker holds no write on dead_letters.
    {
      right: `EXECUTE ON ${fn("dead_letter(bigint[], uuid[], text[], text[], integer[], integer[], integer, boolean)")}`,
      of: role.worker,
      op: dead,
    },
    {
      right: `EXECUTE ON ${fn("dead_letter_announced(bigint[], uuid[], text[], text[], integer[], integer[], integer, boolean, text[], text[], text)")}`,
      of: role.worker,
      op: deadAnnounced,
    },
    { right: `SELECT ON ${names.leases}`, of: role.worker, op: () => workerLeases(worker, schema) },
    { right: `EXECUTE ON ${fn("batch_leased()")}`, of: role.worker, op: () => queueStatus(worker, schema) },
    {
      right: `SELECT ON ${names.migrationsTable}`,
      of: role.worker,
      op: () => migrationState({ connection: worker, schema }),
    },
    {
      right: `EXECUTE ON ${fn("ack_keyed(bigint[], uuid[], integer, uuid, double precision, text, boolean)")}`,
      of: role.worker,
      op: ackKeyed,
    },
    {
      right: `EXECUTE ON ${fn("ack_key_heads(bigint[], uuid[], text[], text[], integer, uuid, double precision, text, boolean)")}`,
      of: role.worker,
      op: ackKeyHeads,
    },
    {
      right: `EXECUTE ON ${fn("promote_heads(text[], text[], integer, uuid, double precision, text)")}`,
      of: role.worker,
      op: promote,
    },
    {
      // promote_heads runs its promotion through promote_heads_after (migration 0009).
      right: `EXECUTE ON ${fn("promote_heads_after(text[], text[], bigint[], integer, uuid, double precision, text)")}`,
      of: role.worker,
      op: promote,
    },
    {
      // The replay preview asks where kept topic events would go (the console's preview, as the service).
      right: `EXECUTE ON ${fn("topic_queues(text)")}`,
      of: role.worker,
      op: () => replayDeadLetters(worker, schema, { all: true }, { dryRun: true }),
    },
    // The worker inbox (migration 0016): the check, the record, and the retention's batch.
    {
      right: `SELECT ON ${names.inbox}`,
      of: role.worker,
      op: () => runQuery(worker, inboxStatements(names, settings).seen, { consumers: ["c"], keys: ["k"] }),
    },
    {
      right: `INSERT ON ${names.inbox}`,
      of: role.worker,
      op: () =>
        runQuery(worker, inboxStatements(names, settings).record, {
          consumers: [`grt-${randomUUID()}`],
          keys: ["k"],
          ids: ["1"],
          queues: ["n.q"],
        }),
    },
    {
      right: `EXECUTE ON ${fn("expire_inbox(double precision, integer)")}`,
      of: role.worker,
      op: () =>
        runQuery(worker, inboxStatements(names, settings).expire, { olderThanMs: 3_600_000, limit: 1 }),
    },
    {
      right: `SELECT ON ${names.inbox}`,
      of: role.inspector,
      op: () => inspector.query(`SELECT consumer, dedupe_key, handled_at FROM ${names.inbox} LIMIT 1`),
    },
    ...SUBSCRIBE_COLUMNS.flatMap((c) => [
      { right: `INSERT (${c}) ON ${names.subscriptions}`, of: role.subscriber, op: subscribeAtStart },
      // ON CONFLICT (pattern, queue) reads its arbiter columns.
      { right: `SELECT (${c}) ON ${names.subscriptions}`, of: role.subscriber, op: subscribeAtStart },
    ]),
    // The generated `matcher` column calls it as the inserting role.
    { right: `EXECUTE ON ${fn("topic_matcher(text)")}`, of: role.subscriber, op: subscribeAtStart },
    {
      right: `EXECUTE ON ${fn("expire_dead_letters(double precision, integer)")}`,
      of: role.expirer,
      op: () => runQuery(expirer, expireDeadLettersStatement(names), { olderThanMs: 3_600_000, limit: 10 }),
    },
    { right: `SELECT ON ${names.leases}`, of: role.inspector, op: () => workerLeases(inspector, schema) },
    {
      right: `EXECUTE ON ${fn("batch_leased()")}`,
      of: role.inspector,
      op: () => queueStatus(inspector, schema),
    },
    {
      // The version check every command makes first, as `run` does.
      right: `SELECT ON ${names.migrationsTable}`,
      of: role.inspector,
      op: () => migrationState({ connection: inspector, schema }),
    },
    {
      right: `SELECT ON ${names.unprocessed}`,
      of: role.inspector,
      op: () => peekMessages(inspector, schema, {}),
    },
    {
      right: `SELECT ON ${dl}`,
      of: role.inspector,
      op: () => listDeadLetters(inspector, schema, {}),
    },
    {
      right: `SELECT ON ${names.subscriptions}`,
      of: role.inspector,
      op: () => listSubscriptions(inspector, { schema }),
    },
    {
      // The preview counts where each kept topic event would go now.
      right: `EXECUTE ON ${fn("topic_queues(text)")}`,
      of: role.inspector,
      op: () => replayDeadLetters(inspector, schema, { all: true }, { dryRun: true }),
    },
    ...INSPECTOR_SELECT_COLUMNS.map((c) => ({
      right: `SELECT (${c}) ON ${m}`,
      of: role.inspector,
      op: inspectorReads,
    })),
    ...REPAIR_INSERT_COLUMNS.map((c) => ({
      right: `INSERT (${c}) ON ${m}`,
      of: role.repairer,
      op: repairerReplay,
    })),
    { right: `SELECT (key) ON ${m}`, of: role.repairer, op: repairerReplay },
    { right: `DELETE ON ${dl}`, of: role.repairer, op: repairerReplay },
    { right: `UPDATE (error) ON ${dl}`, of: role.repairer, op: repairerReplay },
    { right: `EXECUTE ON ${fn("route_unrouted(bigint[])")}`, of: role.repairer, op: repairerRoute },
    {
      right: `DELETE ON ${dl}`,
      of: role.repairer,
      op: () => purgeDeadLetters(repairer, schema, { olderThanMs: 86_400_000 }),
    },
  ];

  it.each(cases.map((c) => [`${c.of.replace(`_${tag}`, "")}: ${c.right}`, c] as const))(
    "%s",
    async (_, c) => {
      await c.op();
      await db.pool.query(`REVOKE ${c.right} FROM "${c.of}"`);
      try {
        expect(await refused(c.op)).toMatch(/permission denied/);
      } finally {
        await db.pool.query(`GRANT ${c.right} TO "${c.of}"`);
      }
      await c.op();
    },
  );
});
