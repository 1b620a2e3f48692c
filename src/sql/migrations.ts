import { type OutboxNames, quoteLiteral } from "./names.js";

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
    recordLiteral(version: number, name: string, checksum: string): string {
      return `INSERT INTO ${names.migrationsTable} (version, name, checksum) VALUES (${version}, ${quoteLiteral(name)}, ${quoteLiteral(checksum)}) ON CONFLICT (version) DO NOTHING`;
    },
  };
}
