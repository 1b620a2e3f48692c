import { parseArgs } from "node:util";

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
export function databaseUrlFrom(flag: string | boolean | undefined): string | undefined {
  if (typeof flag === "string" && flag.length > 0) return flag;
  const env = process.env.DATABASE_URL;
  return env && env.length > 0 ? env : undefined;
}
