import { migrate, printMigrations } from "../migrate/migrator.js";
import { DEFAULT_SCHEMA, validateSchemaName } from "../sql/names.js";
import { redactConnectionString } from "../util/redact.js";
import { databaseUrlFrom, parseCommandArgs, UsageError } from "./args.js";
import { type CliIo, print } from "./io.js";

export const migrateUsage = `Usage: outbox-worker migrate [--schema NAME] [--database-url URL] [--print]

Create or update the outbox schema (tables, indexes, view). Safe to run from many processes at once.

Options:
  --schema NAME        outbox schema (default: ${DEFAULT_SCHEMA}, or OUTBOX_SCHEMA)
  --database-url URL   Postgres connection string (default: DATABASE_URL)
  --print              print the SQL instead of running it (for your own migration tool)
  -h, --help           show this help`;

export async function migrateCommand(argv: string[], io: CliIo): Promise<number> {
  const { values } = parseCommandArgs(argv, {
    schema: { type: "string" },
    "database-url": { type: "string" },
    print: { type: "boolean" },
  });
  if (values.help) {
    print(io, migrateUsage);
    return 0;
  }
  // Checked before anything else, so a hostile name never reaches a connection.
  const schema = validateSchemaName(
    (values.schema as string | undefined) ?? io.env.OUTBOX_SCHEMA ?? DEFAULT_SCHEMA,
  );
  if (values.print) {
    io.stdout(await printMigrations({ schema }));
    return 0;
  }
  const url = databaseUrlFrom(values["database-url"], io.env);
  if (!url) throw new UsageError("no database: set DATABASE_URL or pass --database-url");
  const result = await migrate({
    connection: url,
    schema,
    onApplied: (m) => print(io, `applied ${m.name}`),
  });
  const { functions } = result;
  if (functions.applied.length > 0) print(io, `applied function files: ${functions.applied.join(", ")}`);
  if (functions.keptNewer.length > 0) {
    print(
      io,
      `kept the bodies a newer release applied (not replaced by this version's): ${functions.keptNewer.join(", ")}`,
    );
  }
  print(
    io,
    result.applied.length === 0
      ? `schema "${result.schema}" is up to date (version ${result.version}) on ${redactConnectionString(url)}`
      : `schema "${result.schema}" migrated to version ${result.version} on ${redactConnectionString(url)}`,
  );
  return 0;
}
