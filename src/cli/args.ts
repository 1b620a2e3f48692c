import { parseArgs } from "node:util";
import type pg from "pg";
import { OutboxError } from "../contract/errors.js";
import { DEFAULT_SCHEMA, validateSchemaName } from "../sql/names.js";
import { editDistance } from "../util/edit-distance.js";

/** Thrown for a wrong command line; main prints it with the command's usage and exits 2. */
export class UsageError extends OutboxError {
  override name = "UsageError";
}

export type OptionSpec = Record<
  string,
  { type: "string" | "boolean"; short?: string; default?: string | boolean }
>;

/** Options as checkCommandLine reads them: an OptionSpec, or one with a repeatable option. */
type CheckedOptions = Record<string, { type: "string" | "boolean"; short?: string; multiple?: boolean }>;

export interface ParsedArgs {
  values: Record<string, string | boolean | undefined>;
  positionals: string[];
}

const HELP_OPTION: OptionSpec = { help: { type: "boolean", short: "h" } };

export function parseCommandArgs(args: string[], options: OptionSpec): ParsedArgs {
  const all = { ...options, ...HELP_OPTION };
  checkCommandLine(args, all);
  try {
    return parseArgs({ args, options: all, allowPositionals: true, strict: true });
  } catch (error) {
    throw new UsageError((error as Error).message);
  }
}

/**
 * Refuses what node's strict parseArgs refuses, in our words: its own messages are written for its API,
 * and the one for an unknown option ends in an unbalanced quote. Throws a UsageError naming the option.
 */
export function checkCommandLine(args: readonly string[], options: CheckedOptions): void {
  const { tokens } = parseArgs({
    args: [...args],
    options,
    allowPositionals: true,
    strict: false,
    tokens: true,
  });
  for (const token of tokens) {
    if (token.kind !== "option") continue;
    const spec = Object.hasOwn(options, token.name) ? options[token.name] : undefined;
    if (!spec) throw new UsageError(unknownOption(token.rawName, options));
    if (spec.type === "boolean" && token.value !== undefined) {
      throw new UsageError(
        `${token.rawName} takes no value, got ${JSON.stringify(`${token.rawName}=${token.value}`)}`,
      );
    }
    if (spec.type !== "string") continue;
    if (token.value === undefined) throw new UsageError(`${token.rawName} needs a value`);
    // strict parseArgs refuses a separate value that looks like an option: a forgotten value, most likely.
    if (!token.inlineValue && token.value.startsWith("-")) {
      throw new UsageError(
        `${token.rawName} needs a value, got the option ${JSON.stringify(token.value)} (if that is the value, write ${token.rawName}=${token.value})`,
      );
    }
  }
}

/** `unknown option "--schem" (did you mean --schema?)`: the hint only for a near miss of a long option. */
function unknownOption(raw: string, options: CheckedOptions): string {
  const [best] = Object.keys(options)
    .map((name) => ({ name, d: editDistance(raw.replace(/^-+/, ""), name) }))
    .sort((a, b) => a.d - b.d);
  const hint = raw.startsWith("--") && best && best.d <= 2 ? ` (did you mean --${best.name}?)` : "";
  return `unknown option ${JSON.stringify(raw)}${hint}`;
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
