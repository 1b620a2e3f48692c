import { type OutboxNames, quoteLiteral } from "./names.js";

/** One row of the function files' table (migration 0022; replaced_checksums from 0025). */
export interface AppliedFunctionRow {
  name: string;
  checksum: string;
  package_version: string;
  /** Bodies of this file a later build of the same version replaced: never applied again under it. */
  replaced_checksums: string[];
}

/** A function of the schema as the catalog has it, before and after its file is applied. */
export interface LiveFunctionRow {
  oid: number;
  /** `"schema".name(argtypes)`, as regprocedure prints it: safe to splice into DROP or GRANT. */
  signature: string;
  /** Null: Postgres' defaults (EXECUTE for PUBLIC). */
  acl: string[] | null;
}

/** One row of the migrations table. */
export interface AppliedMigrationRow {
  version: number;
  name: string;
  checksum: string;
  applied_at: Date;
}

// Two-key advisory lock: a constant namespace ("outb") and the schema's hash, so that migrating two
// schemas in one database does not serialise, and nothing else's lock can collide with ours by chance.
const LOCK_NAMESPACE = 0x6f757462;

/**
 * The migrator's transaction control, as plain text: it runs on a connection it may have borrowed from the
 * caller's pool, where a named prepared statement of ours has no business.
 */
export const MIGRATION_TX = {
  begin: "BEGIN",
  commit: "COMMIT",
  rollback: "ROLLBACK",
  /** Around a function file: a refused CREATE OR REPLACE (a changed signature) is undone, then dropped and made. */
  savepoint: "SAVEPOINT function_file",
  rollbackToSavepoint: "ROLLBACK TO SAVEPOINT function_file",
} as const;

/** A scratch schema made only to be dumped (schema.sql's drift check). */
export function dropScratchSchema(schema: string): string {
  return `DROP SCHEMA IF EXISTS "${schema.replaceAll('"', '""')}" CASCADE`;
}

export function migrationStatements(names: OutboxNames) {
  const schemaLiteral = quoteLiteral(names.schema);
  return {
    lock: `SELECT pg_advisory_lock(${LOCK_NAMESPACE}, hashtext(${schemaLiteral}))`,
    unlock: `SELECT pg_advisory_unlock(${LOCK_NAMESPACE}, hashtext(${schemaLiteral}))`,
    /** The same lock for one transaction: `grant` waits for a migration, and for another grant, of the schema. */
    lockTransaction: `SELECT pg_advisory_xact_lock(${LOCK_NAMESPACE}, hashtext(${schemaLiteral}))`,
    createSchema: `CREATE SCHEMA IF NOT EXISTS ${names.quotedSchema}`,
    createTable: `CREATE TABLE IF NOT EXISTS ${names.migrationsTable} (
  version    integer     PRIMARY KEY,
  name       text        NOT NULL,
  checksum   text        NOT NULL,
  applied_at timestamptz NOT NULL DEFAULT now()
)`,
    /** Null when the table does not exist yet (a read-only check must not create it). */
    tableExists: `SELECT to_regclass(${quoteLiteral(`${names.quotedSchema}.schema_migrations`)}) IS NOT NULL AS exists`,
    applied: `SELECT version, name, checksum, applied_at FROM ${names.migrationsTable} ORDER BY version`,
    /** Indexes of the schema left INVALID by a concurrent build that failed or was cancelled. */
    invalidIndexes: `SELECT c.relname AS name FROM pg_index AS i
JOIN pg_class AS c ON c.oid = i.indexrelid
JOIN pg_namespace AS n ON n.oid = c.relnamespace
WHERE n.nspname = ${schemaLiteral} AND NOT i.indisvalid`,
    /** $1 version, $2 name, $3 checksum */
    record: `INSERT INTO ${names.migrationsTable} (version, name, checksum) VALUES ($1, $2, $3)`,
    /** Null when migration 0022 has not run: no function file can be recorded yet. */
    functionsTableExists: `SELECT to_regclass(${quoteLiteral(`${names.quotedSchema}.schema_functions`)}) IS NOT NULL AS exists`,
    appliedFunctions: `SELECT name, checksum, package_version, replaced_checksums FROM ${names.quotedSchema}.schema_functions ORDER BY name`,
    /** $1 name, $2 checksum, $3 package version, $4 replaced checksums (text[]) */
    recordFunction: `INSERT INTO ${names.quotedSchema}.schema_functions AS f (name, checksum, package_version, replaced_checksums)
VALUES ($1, $2, $3, $4)
ON CONFLICT (name) DO UPDATE SET checksum = excluded.checksum, package_version = excluded.package_version,
  replaced_checksums = excluded.replaced_checksums, applied_at = now()`,
    /**
     * For `migrate --print`, which applies every file whatever the schema holds: the replaced body joins the
     * list when the version string is the same (`migrate` compares versions by precedence instead).
     */
    recordFunctionLiteral(name: string, checksum: string, packageVersion: string): string {
      return `INSERT INTO ${names.quotedSchema}.schema_functions AS f (name, checksum, package_version) VALUES (${quoteLiteral(name)}, ${quoteLiteral(checksum)}, ${quoteLiteral(packageVersion)}) ON CONFLICT (name) DO UPDATE SET checksum = excluded.checksum, package_version = excluded.package_version, replaced_checksums = CASE WHEN f.checksum = excluded.checksum THEN f.replaced_checksums WHEN f.package_version = excluded.package_version THEN array_append(f.replaced_checksums, f.checksum) ELSE '{}' END, applied_at = now()`;
    },
    /** $1 function name → every overload of it in the schema (a function file owns its name). */
    functionsNamed: `SELECT p.oid::int AS oid, p.oid::regprocedure::text AS signature, p.proacl::text[] AS acl
FROM pg_catalog.pg_proc AS p
WHERE p.pronamespace = ${schemaLiteral}::regnamespace AND p.proname = $1
ORDER BY p.oid`,
    /** $1 an aclitem[] as text → the roles holding EXECUTE in it, as GRANT names them (PUBLIC for 0). */
    executeGrantees: `SELECT CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE a.grantee::regrole::text END AS role
FROM aclexplode($1::text[]::aclitem[]) AS a
WHERE a.privilege_type = 'EXECUTE'
ORDER BY 1`,
    /** $1 a function's signature as `name(argtypes)` → its ACL (null: defaults), or no row when absent. */
    aclOf: `SELECT p.proacl::text[] AS acl FROM pg_catalog.pg_proc AS p
WHERE p.oid = to_regprocedure(${quoteLiteral(`${names.quotedSchema}.`)} || $1)`,
    /** Signatures come from the catalog (regprocedure), roles from executeGrantees: both print quoted. */
    dropFunction: (signature: string) => `DROP FUNCTION ${signature}`,
    revokeFunctionFromPublic: (signature: string) => `REVOKE ALL ON FUNCTION ${signature} FROM PUBLIC`,
    grantExecute: (signature: string, role: string) => `GRANT EXECUTE ON FUNCTION ${signature} TO ${role}`,
    /** An index left INVALID by a crashed concurrent build, dropped before the re-run rebuilds it. */
    dropInvalidIndex: (name: string) =>
      `DROP INDEX CONCURRENTLY IF EXISTS ${names.quotedSchema}."${name.replaceAll('"', '""')}"`,
    recordLiteral(version: number, name: string, checksum: string): string {
      return `INSERT INTO ${names.migrationsTable} (version, name, checksum) VALUES (${version}, ${quoteLiteral(name)}, ${quoteLiteral(checksum)}) ON CONFLICT (version) DO NOTHING`;
    },
  };
}
