import type pg from "pg";
import { MigrationError } from "../contract/errors.js";
import {
  type AppliedFunctionRow,
  type LiveFunctionRow,
  MIGRATION_TX,
  type migrationStatements,
} from "../sql/migrations.js";
import type { OutboxNames } from "../sql/names.js";
import type { FunctionFile } from "./function-files.js";
import { renderMigration } from "./migration-files.js";
import { compareVersions } from "./package-version.js";

type Statements = ReturnType<typeof migrationStatements>;

/** What one pass over the function files did. */
export interface FunctionsResult {
  /** Files applied: new, or changed since the schema recorded them. */
  applied: string[];
  /**
   * Files left alone: a newer release applied another body (never downgraded), or a later build of this
   * same version replaced this body (never put back, so two builds never flip it back and forth).
   */
  keptNewer: string[];
}

/** SQLSTATE invalid_function_definition: CREATE OR REPLACE cannot change a return type or argument names. */
const INVALID_FUNCTION_DEFINITION = "42P13";

/**
 * Brings every function file's function up to date, each in its own transaction: applied when the schema
 * has no record of it, records another checksum from an older release, or another checksum from this same
 * version (by precedence: build metadata aside) that never replaced this file's; kept when a newer release
 * recorded it (its body stays callable by the previous release, as every body change must be) or when a
 * build of this version replaced this very body. Each application under one version adds the body it
 * replaces to the record, so builds of one version migrating in turn settle on the last new body instead
 * of re-applying each other's on every migrate. The caller holds the migration lock, so two migrators
 * never apply a file at once.
 */
export async function applyFunctionFiles(
  client: pg.ClientBase,
  files: FunctionFile[],
  names: OutboxNames,
  sql: Statements,
  version: string,
): Promise<FunctionsResult> {
  const result: FunctionsResult = { applied: [], keptNewer: [] };
  if (files.length === 0) return result;
  const exists = (await client.query<{ exists: boolean }>(sql.functionsTableExists)).rows[0]?.exists;
  if (!exists) {
    throw new MigrationError(
      `schema "${names.schema}" has no schema_functions table: the function files need migration 0022 (function_files)`,
    );
  }
  const recorded = new Map(
    (await client.query<AppliedFunctionRow>(sql.appliedFunctions)).rows.map((r) => [r.name, r]),
  );
  for (const file of files) {
    const row = recorded.get(file.name);
    if (row?.checksum === file.checksum) continue;
    const order = row ? compareVersions(row.package_version, version) : -1;
    if (order > 0 || (order === 0 && row?.replaced_checksums.includes(file.checksum))) {
      result.keptNewer.push(file.name);
      continue;
    }
    const replaced = order === 0 && row ? [...row.replaced_checksums, row.checksum] : [];
    try {
      await client.query(MIGRATION_TX.begin);
      await applyOne(client, file, names, sql);
      await client.query(sql.recordFunction, [file.name, file.checksum, version, replaced]);
      await client.query(MIGRATION_TX.commit);
    } catch (error) {
      await client.query(MIGRATION_TX.rollback).catch(() => {});
      throw new MigrationError(
        `function file ${file.name}.sql failed on schema "${names.schema}": ${String(error)}`,
        { cause: error },
      );
    }
    result.applied.push(file.name);
  }
  return result;
}

/**
 * CREATE OR REPLACE keeps the function's oid, owner and grants. A changed signature (other argument types,
 * return type or argument names) makes a new function instead: the old one is dropped in the same
 * transaction and the new one gets its EXECUTE grants, so callers of the old signature fail at once rather
 * than reach a stale body, and no role loses or gains a right. A DROP that something depends on (a trigger,
 * a generated column) fails the file: such a change needs a numbered migration.
 */
async function applyOne(client: pg.ClientBase, file: FunctionFile, names: OutboxNames, sql: Statements) {
  const live = async () => (await client.query<LiveFunctionRow>(sql.functionsNamed, [file.name])).rows;
  const before = await live();
  const body = renderMigration(file, names);
  await client.query(MIGRATION_TX.savepoint);
  try {
    await client.query(body);
  } catch (error) {
    if ((error as { code?: unknown }).code !== INVALID_FUNCTION_DEFINITION || before.length === 0)
      throw error;
    await client.query(MIGRATION_TX.rollbackToSavepoint);
    for (const old of before) await client.query(sql.dropFunction(old.signature));
    await client.query(body);
  }
  const after = await live();
  const created = after.filter((f) => !before.some((b) => b.oid === f.oid));
  if (created.length === 0) return; // replaced in place: same oid, owner and grants
  const [fresh] = created;
  if (!fresh || created.length > 1) {
    throw new MigrationError(
      `function file ${file.name}.sql must create one function, not ${created.length}`,
    );
  }
  // A new overload beside the old signature: the file owns the name, so the old one goes.
  for (const old of before) {
    if (after.some((a) => a.oid === old.oid)) await client.query(sql.dropFunction(old.signature));
  }
  const from = before[0] ?? (file.grantAs ? await aclOf(client, sql, file.grantAs) : undefined);
  await copyExecute(client, sql, fresh.signature, from);
}

async function aclOf(client: pg.ClientBase, sql: Statements, signature: string) {
  const row = (await client.query<{ acl: string[] | null }>(sql.aclOf, [signature])).rows[0];
  if (!row) throw new MigrationError(`outbox:grant-as names ${signature}, which the schema does not have`);
  return row;
}

/**
 * The new function's EXECUTE: as `from`'s (null ACL: Postgres' defaults, which the new one has too), or,
 * with nothing to copy, the owner's alone until `outbox-worker grant` gives it out.
 */
async function copyExecute(
  client: pg.ClientBase,
  sql: Statements,
  signature: string,
  from: { acl: string[] | null } | undefined,
) {
  if (from && from.acl === null) return;
  await client.query(sql.revokeFunctionFromPublic(signature));
  if (!from?.acl) return;
  const grantees = (await client.query<{ role: string }>(sql.executeGrantees, [from.acl])).rows;
  for (const { role } of grantees) await client.query(sql.grantExecute(signature, role));
}
