import { parseArgs } from "node:util";
import type pg from "pg";
import { DEFAULT_SCHEMA, validateSchemaName } from "../sql/names.js";

/** Thrown for a wrong command line; main prints it with the command's usage and exits 2. */
export class UsageError extends Error {
  override name = "UsageError";
}

export type OptionSpec = Record<
  string,
  { type: "string" | "boolean"; short?: string; default?: string | boolean }
>;

export interface ParsedArgs {
  values: Record<string, string | boolean | undefined>;
  positionals: string[];
}

export function parseCommandArgs(args: string[], options: OptionSpec): ParsedArgs {
  try {
    return parseArgs({
      args,
      options: { ...options, help: { type: "boolean", short: "h" } },
      allowPositionals: true,
      strict: true,
    });
  } catch (error) {
    throw new UsageError((error as Error).message);
  }
}

/** The database to use: --database-url, else DATABASE_URL. Never printed without redaction. */
export function databaseUrlFrom(
  flag: string | boolean | undefined,
  env: NodeJS.ProcessEnv,
): string | undefined {
  if (typeof flag === "string" && flag.length > 0) return flag;
  const url = env.DATABASE_URL;
  return url && url.length > 0 ? url : undefined;
}

type Values = Record<string, string | boolean | string[] | undefined>;

/** --schema, else OUTBOX_SCHEMA, else the default; validated before anything connects. */
export function schemaFrom(values: Values, env: NodeJS.ProcessEnv): string {
  return validateSchemaName((values.schema as string | undefined) ?? env.OUTBOX_SCHEMA ?? DEFAULT_SCHEMA);
}

/**
 * One short-lived connection for a command. The schema is checked and the database found before
 * connecting, so a bad name never reaches a server. The driver is loaded only then: a usage error never
 * loads it. PGOPTIONS and PGPASSWORD come from the command's environment (the process's, when installed,
 * which is what the driver would read itself).
 */
export async function withDatabase<T>(
  values: Values,
  env: NodeJS.ProcessEnv,
  applicationName: string,
  run: (client: pg.Client, schema: string) => Promise<T>,
): Promise<T> {
  const schema = schemaFrom(values, env);
  const url = databaseUrlFrom(values["database-url"] as string | undefined, env);
  if (!url) throw new UsageError("no database: set DATABASE_URL or pass --database-url");
  const { default: driver } = await import("pg");
  const client = new driver.Client({
    connectionString: url,
    application_name: applicationName,
    ...(env.PGOPTIONS === undefined ? {} : { options: env.PGOPTIONS }),
    ...(env.PGPASSWORD === undefined ? {} : { password: env.PGPASSWORD }),
  });
  await client.connect();
  try {
    return await run(client, schema);
  } finally {
    await client.end();
  }
}
