import { randomBytes } from "node:crypto";
import { fileURLToPath } from "node:url";
import pg from "pg";
import { dropScratchSchema } from "../sql/migrations.js";
import { migrate } from "./migrator.js";
import { dumpSchema } from "./schema-dump.js";

/** schema.sql at the repository's root (not shipped: the migrations are what a database gets). */
export const SCHEMA_FILE = fileURLToPath(new URL("../../schema.sql", import.meta.url));

/** How schema.sql is regenerated; the drift test prints it. */
export const SCHEMA_DUMP_COMMAND = "DATABASE_URL=postgres://… npm run schema:dump";

/**
 * The dump of a schema freshly migrated with `migrationsDir` (default: the shipped migrations and function
 * files), made in a scratch schema of `url`'s database and dropped after.
 */
export async function freshSchemaDump(url: string, migrationsDir?: string): Promise<string> {
  const schema = `schema_dump_${randomBytes(5).toString("hex")}`;
  const client = new pg.Client({ connectionString: url, application_name: "outbox-schema-dump" });
  await client.connect();
  try {
    await migrate({ connection: client, schema, ...(migrationsDir ? { migrationsDir } : {}) });
    return await dumpSchema(client, schema);
  } finally {
    await client.query(dropScratchSchema(schema)).catch(() => {});
    await client.end();
  }
}
