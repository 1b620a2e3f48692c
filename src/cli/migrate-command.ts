import { migrate, printMigrations } from "../migrate/migrator.js";
import { DEFAULT_SCHEMA, validateSchemaName } from "../sql/names.js";
import { redactConnectionString } from "../util/redact.js";
import { databaseUrlFrom, parseCommandArgs, UsageError } from "./args.js";

export const migrateUsage = `Usage: outbox-worker migrate [--schema NAME] [--database-url URL] [--print]

Create or update the outbox schema (tables, indexes, view). Safe to run from many processes at once.

Options:
  --schema NAME        outbox schema (default: ${DEFAULT_SCHEMA}, or OUTBOX_SCHEMA)
  --database-url URL   Postgres connection string (default: DATABASE_URL)
  --print              print the SQL instead of running it (for your own migration tool)
  -h, --help           show this help`;

export async function migrateCommand(argv: string[]): Promise<number> {
  const { values } = parseCommandArgs(argv, {
    schema: { type: "string" },
    "database-url": { type: "string" },
    print: { type: "boolean" },
  });
  if (values.help) {
    console.log(migrateUsage);
    return 0;
  }
  // Checked before anything else, so a hostile name never reaches a connection.
  const schema = validateSchemaName(
    (values.schema as string | undefined) ?? process.env.OUTBOX_SCHEMA ?? DEFAULT_SCHEMA,
  );
  if (values.print) {
    process.stdout.write(await printMigrations({ schema }));
    return 0;
  }
  const url = databaseUrlFrom(values["database-url"]);
  if (!url) throw new UsageError("no database: set DATABASE_URL or pass --database-url");
  const result = await migrate({
    connection: url,
    schema,
    onApplied: (m) => console.log(`applied ${m.name}`),
  });
  console.log(
    result.applied.length === 0
      ? `schema "${result.schema}" is up to date (version ${result.version}) on ${redactConnectionString(url)}`
      : `schema "${result.schema}" migrated to version ${result.version} on ${redactConnectionString(url)}`,
  );
  return 0;
}
