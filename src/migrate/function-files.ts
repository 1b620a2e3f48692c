import { createHash } from "node:crypto";
import { readdir, readFile } from "node:fs/promises";
import path from "node:path";
import { MigrationError } from "../contract/errors.js";

/**
 * A function file as shipped (migrations/functions/<name>.sql): the live definition of one function of the
 * schema, with the migrations' `{{schema}}` and `{{channel}}` placeholders. The migrator (re)applies it after
 * the numbered migrations whenever its checksum differs from the one the schema recorded.
 */
export interface FunctionFile {
  /** The function's name: the file's, and the only function of that name in the schema. */
  name: string;
  /** sha256 of the file with line endings normalised, as for migrations. */
  checksum: string;
  template: string;
  /**
   * `-- outbox:grant-as name(argtypes)`: when the file creates its function for the first time, its EXECUTE
   * rights are copied from that function's (a successor is callable by whoever could call its predecessor).
   * Without it, a new function is the owner's alone until `outbox-worker grant` gives it out.
   */
  grantAs?: string;
}

/** Where the function files of a migrations folder live. */
export const functionsDirOf = (migrationsDir: string): string => path.join(migrationsDir, "functions");

const FILE_NAME = /^([a-z_][a-z0-9_]*)\.sql$/;
const GRANT_AS = /^-- outbox:grant-as ([a-z_][a-z0-9_]*\([a-z0-9_ ,[\]]*\))[ \t]*$/m;
// Anything else would let one file define (or replace) a function another file owns.
const DEFINITION = /^CREATE\s+(?:OR\s+REPLACE\s+)?FUNCTION\s+\{\{schema\}\}\.([a-z_][a-z0-9_]*)\s*\(/gim;

/** The function files of a folder, by name; none when the folder does not exist (a release before 0022). */
export async function loadFunctionFiles(dir: string): Promise<FunctionFile[]> {
  let entries: string[];
  try {
    entries = (await readdir(dir)).filter((f) => f.endsWith(".sql")).sort();
  } catch (error) {
    if ((error as { code?: unknown }).code === "ENOENT") return [];
    throw error;
  }
  const files: FunctionFile[] = [];
  for (const entry of entries) {
    const name = FILE_NAME.exec(entry)?.[1];
    if (!name) {
      throw new MigrationError(
        `function file "${entry}" must be named after its function: name.sql (lower-case)`,
      );
    }
    const template = (await readFile(path.join(dir, entry), "utf8")).replaceAll("\r\n", "\n");
    const defined = [...template.matchAll(DEFINITION)].map((m) => m[1]);
    if (defined.length !== 1 || defined[0] !== name) {
      throw new MigrationError(
        `function file "${entry}" must hold exactly one CREATE OR REPLACE FUNCTION {{schema}}.${name}(…); it defines ${defined.length === 0 ? "none" : defined.join(", ")}`,
      );
    }
    const grantAs = GRANT_AS.exec(template)?.[1];
    files.push({
      name,
      checksum: createHash("sha256").update(template).digest("hex"),
      template,
      ...(grantAs ? { grantAs } : {}),
    });
  }
  return files;
}
