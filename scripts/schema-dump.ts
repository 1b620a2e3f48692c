// Regenerates schema.sql, the schema as a freshly migrated database has it: DATABASE_URL=… npm run schema:dump
// Migrates a scratch schema in that database (dropped after), reads it back from the catalog, writes the file.
import { writeFile } from "node:fs/promises";
import { freshSchemaDump, SCHEMA_DUMP_COMMAND, SCHEMA_FILE } from "../src/migrate/schema-file.js";

const url = process.env.DATABASE_URL;
if (!url) {
  console.error(`DATABASE_URL is not set: ${SCHEMA_DUMP_COMMAND}`);
  process.exit(2);
}
await writeFile(SCHEMA_FILE, await freshSchemaDump(url));
console.log(`wrote ${SCHEMA_FILE}`);
