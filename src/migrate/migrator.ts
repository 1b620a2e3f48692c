import { setTimeout as delay } from "node:timers/promises";
import pg from "pg";
import { MigrationError, OutboxError } from "../contract/errors.js";
import { type AppliedMigrationRow, MIGRATION_TX, migrationStatements } from "../sql/migrations.js";
import { DEFAULT_SCHEMA, outboxNames } from "../sql/names.js";
import { applyFunctionFiles } from "./apply-functions.js";
import { functionsDirOf, loadFunctionFiles } from "./function-files.js";
import {
  loadMigrationFiles,
  MIGRATIONS_DIR,
  type MigrationFile,
  migrationStatementsOf,
  renderMigration,
} from "./migration-files.js";
import { packageVersion } from "./package-version.js";

/** Where and what {@link migrate} applies. */
export interface MigrateOptions {
  /** A connection string, a `pg.Pool` (one client is borrowed) or a connected `pg.Client`. */
  connection: string | pg.Pool | pg.Client;
  /** The outbox schema; default `"outbox"` ({@link DEFAULT_SCHEMA}). */
  schema?: string;
  /**
   * Folder of `NNNN_name.sql` files, and of the function files in its `functions/` folder; defaults to the
   * ones shipped with this package.
   */
  migrationsDir?: string;
  /** Told about each migration as it is applied. */
  onApplied?: (migration: { version: number; name: string }) => void;
}

/** What a {@link migrate} run did. */
export interface MigrateResult {
  schema: string;
  /** The migrations this run applied, in order; empty when the schema was already up to date. */
  applied: { version: number; name: string }[];
  /** Latest version in the database after the run. */
  version: number;
  /**
   * The function files (migrations/functions): those this run applied (new or changed), and those it left
   * alone because a newer release of this package had applied another body, or a build of this same
   * version had replaced this one (a replaced body is never put back).
   */
  functions: { applied: string[]; keptNewer: string[] };
}

interface Session {
  client: pg.ClientBase;
  release(): Promise<void>;
}

async function openSession(connection: MigrateOptions["connection"]): Promise<Session> {
  if (typeof connection === "string") {
    const client = new pg.Client({ connectionString: connection, application_name: "outbox-migrate" });
    await client.connect();
    return { client, release: () => client.end() };
  }
  // A Pool of another copy of pg is not an instance of ours: its counters tell it from a Client.
  if (connection instanceof pg.Pool || "waitingCount" in connection) {
    const client = await (connection as pg.Pool).connect();
    return { client, release: async () => client.release() };
  }
  return { client: connection, release: async () => {} };
}

/** Applied versions must match the files byte for byte; a changed or unknown one stops everything. */
function checkApplied(files: MigrationFile[], applied: AppliedMigrationRow[], schema: string): void {
  for (const row of applied) {
    const file = files.find((f) => f.version === row.version);
    if (!file) {
      throw new MigrationError(
        `schema "${schema}" has migration ${row.version} (${row.name}) that this package does not know: the database is newer than the code`,
      );
    }
    if (file.checksum !== row.checksum) {
      throw new MigrationError(
        `migration ${file.name} was changed after it was applied to schema "${schema}" (checksum ${row.checksum.slice(0, 12)} in the database, ${file.checksum.slice(0, 12)} on disk); add a new migration instead of editing an applied one`,
      );
    }
  }
}

function isConnection(value: unknown): value is MigrateOptions["connection"] {
  if (typeof value === "string") return value.length > 0;
  const c = value as { query?: unknown; connect?: unknown } | null;
  return (
    typeof c === "object" && c !== null && typeof c.query === "function" && typeof c.connect === "function"
  );
}

/**
 * `migrate(pool)` as well as `migrate({ connection: pool })`: a bare connection is all the options.
 * Anything else is refused by name here, not by a TypeError from deep inside.
 */
function migrateOptions(input: unknown): MigrateOptions {
  if (isConnection(input)) return { connection: input };
  if (typeof input === "object" && input !== null && isConnection((input as MigrateOptions).connection)) {
    return input as MigrateOptions;
  }
  const got =
    typeof input === "object" && input !== null
      ? `an object whose connection is ${describeValue((input as { connection?: unknown }).connection)}`
      : describeValue(input);
  throw new MigrationError(
    `migrate() takes { connection, schema? } or the connection itself (a connection string, a pg.Pool or a connected pg.Client); got ${got}`,
  );
}

function describeValue(value: unknown): string {
  if (value === undefined || value === null || value === "") return String(JSON.stringify(value) ?? value);
  if (typeof value === "object") return `an object without query() and connect()`;
  return `a ${typeof value}`;
}

/**
 * Bring the outbox schema up to date. Each migration runs in its own transaction; the whole run holds an
 * advisory lock so two processes starting at once apply each file once. Running it again is a no-op.
 * Takes the options, or just the connection (default schema).
 */
export async function migrate(input: MigrateOptions | MigrateOptions["connection"]): Promise<MigrateResult> {
  const options = migrateOptions(input);
  const names = outboxNames(options.schema ?? DEFAULT_SCHEMA);
  const files = await loadMigrationFiles(options.migrationsDir);
  const functionFiles = await loadFunctionFiles(functionsDirOf(options.migrationsDir ?? MIGRATIONS_DIR));
  const sql = migrationStatements(names);
  const session = await openSession(options.connection);
  const { client } = session;
  const applied: MigrateResult["applied"] = [];
  let functions: MigrateResult["functions"];
  try {
    await client.query(sql.lock);
    try {
      await client.query(sql.createSchema);
      await client.query(sql.createTable);
      const done = (await client.query<AppliedMigrationRow>(sql.applied)).rows;
      checkApplied(files, done, names.schema);
      for (const file of files) {
        if (done.some((row) => row.version === file.version)) continue;
        try {
          if (file.noTransaction) await applyWithoutTransaction(client, file, names, sql);
          else await applyInTransactionRetrying(client, file, names, sql);
        } catch (error) {
          throw new MigrationError(
            `migration ${file.name} failed on schema "${names.schema}": ${String(error)}`,
            {
              cause: error,
            },
          );
        }
        applied.push({ version: file.version, name: file.name });
        options.onApplied?.({ version: file.version, name: file.name });
      }
      // After every numbered migration: a body may use any column or table they create.
      functions = await applyFunctionFiles(client, functionFiles, names, sql, packageVersion());
    } finally {
      await client.query(sql.unlock).catch(() => {});
    }
  } finally {
    await session.release();
  }
  const version = Math.max(...files.map((f) => f.version));
  return { schema: names.schema, applied, version, functions };
}

type Statements = ReturnType<typeof migrationStatements>;
type Names = ReturnType<typeof outboxNames>;

/** SQLSTATE lock_not_available: a migration's `SET LOCAL lock_timeout` ran out waiting for a table lock. */
const LOCK_NOT_AVAILABLE = "55P03";
const LOCK_ATTEMPTS = 30;

/**
 * A migration that changes the messages table sets a short lock_timeout: waiting behind a long
 * transaction would queue every producer behind its lock request. It gives up instead, and is retried
 * here after a pause in which producers go on (up to about a minute in all).
 */
async function applyInTransactionRetrying(
  client: pg.ClientBase,
  file: MigrationFile,
  names: Names,
  sql: Statements,
) {
  for (let attempt = 1; ; attempt++) {
    try {
      return await applyInTransaction(client, file, names, sql);
    } catch (error) {
      const code = (error as { code?: unknown }).code;
      if (code !== LOCK_NOT_AVAILABLE || attempt >= LOCK_ATTEMPTS) {
        if (code === LOCK_NOT_AVAILABLE) {
          throw new OutboxError(
            `a table lock was not available in ${LOCK_ATTEMPTS} tries: a long transaction on the outbox tables holds it (see pg_stat_activity)`,
            { cause: error },
          );
        }
        throw error;
      }
      await delay(Math.min(2000, 100 * 2 ** attempt) * (0.5 + Math.random() / 2));
    }
  }
}

async function applyInTransaction(client: pg.ClientBase, file: MigrationFile, names: Names, sql: Statements) {
  await client.query(MIGRATION_TX.begin);
  try {
    await client.query(renderMigration(file, names));
    await client.query(sql.record, [file.version, file.name, file.checksum]);
    await client.query(MIGRATION_TX.commit);
  } catch (error) {
    await client.query(MIGRATION_TX.rollback).catch(() => {});
    throw error;
  }
}

/**
 * One statement at a time, outside a transaction, so `CREATE INDEX CONCURRENTLY` can build while producers
 * keep writing; recorded only when every statement succeeded. A build that crashed halfway leaves an INVALID
 * index that `IF NOT EXISTS` would skip: those in the outbox schema are dropped first (concurrently too), so a
 * re-run rebuilds them. The session's advisory lock keeps two migrators from doing this at once.
 */
async function applyWithoutTransaction(
  client: pg.ClientBase,
  file: MigrationFile,
  names: Names,
  sql: Statements,
) {
  const { rows } = await client.query<{ name: string }>(sql.invalidIndexes);
  for (const { name } of rows) await client.query(sql.dropInvalidIndex(name));
  for (const statement of migrationStatementsOf(renderMigration(file, names))) await client.query(statement);
  await client.query(sql.record, [file.version, file.name, file.checksum]);
}

/** Which migrations a database has, as {@link migrationState} reads it. */
export interface MigrationState {
  schema: string;
  /** Versions applied, in order. */
  applied: number[];
  /** Shipped versions not applied yet: run {@link migrate} (or `outbox-worker migrate`). */
  pending: number[];
  /** True when every shipped migration is applied and none has drifted. */
  current: boolean;
}

/**
 * Read-only: which migrations are applied and which are pending, e.g. for a readiness check or a deploy
 * step that refuses to start on an old schema. Creates nothing, takes no lock. Throws {@link MigrationError}
 * when an applied migration has drifted from its file or is unknown to this version.
 */
export async function migrationState(options: Omit<MigrateOptions, "onApplied">): Promise<MigrationState> {
  const names = outboxNames(options.schema ?? DEFAULT_SCHEMA);
  const files = await loadMigrationFiles(options.migrationsDir);
  const sql = migrationStatements(names);
  const session = await openSession(options.connection);
  try {
    const exists = (await session.client.query<{ exists: boolean }>(sql.tableExists)).rows[0]?.exists;
    const rows = exists ? (await session.client.query<AppliedMigrationRow>(sql.applied)).rows : [];
    checkApplied(files, rows, names.schema);
    const applied = rows.map((r) => r.version);
    const pending = files.map((f) => f.version).filter((v) => !applied.includes(v));
    return { schema: names.schema, applied, pending, current: pending.length === 0 };
  } finally {
    await session.release();
  }
}

/**
 * The SQL `migrate` would run, for teams that apply migrations with their own tool. It also records each
 * version in the migrations table, so `migrate` later sees them as applied instead of running them twice.
 */
export async function printMigrations(
  options: { schema?: string; migrationsDir?: string } = {},
): Promise<string> {
  const names = outboxNames(options.schema ?? DEFAULT_SCHEMA);
  const files = await loadMigrationFiles(options.migrationsDir);
  const functionFiles = await loadFunctionFiles(functionsDirOf(options.migrationsDir ?? MIGRATIONS_DIR));
  const version = packageVersion();
  const sql = migrationStatements(names);
  const parts = [
    `-- outbox schema "${names.schema}": ${files.length} migration(s). Each block is one transaction, unless it says otherwise.`,
    `${sql.createSchema};`,
    `${sql.createTable};`,
  ];
  for (const file of files) {
    const body = renderMigration(file, names).trimEnd();
    const record = `${sql.recordLiteral(file.version, file.name, file.checksum)};`;
    parts.push(
      `\n-- ${file.name} (sha256 ${file.checksum})`,
      // CREATE INDEX CONCURRENTLY cannot run inside a transaction block: these run statement by statement.
      ...(file.noTransaction
        ? ["-- runs outside a transaction, one statement at a time", body, record]
        : [`${MIGRATION_TX.begin};`, body, record, `${MIGRATION_TX.commit};`]),
    );
  }
  // The function files' live bodies, recorded as `migrate` records them. A changed signature is `migrate`'s
  // alone to handle (it drops the old one and carries its grants over): see docs/contributing/migrations.md.
  for (const file of functionFiles) {
    parts.push(
      `\n-- function ${file.name} (sha256 ${file.checksum})`,
      `${MIGRATION_TX.begin};`,
      renderMigration(file, names).trimEnd(),
      `${sql.recordFunctionLiteral(file.name, file.checksum, version)};`,
      `${MIGRATION_TX.commit};`,
    );
  }
  return `${parts.join("\n")}\n`;
}
