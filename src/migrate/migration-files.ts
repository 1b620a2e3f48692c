import { createHash } from "node:crypto";
import { readdir, readFile } from "node:fs/promises";
import { fileURLToPath } from "node:url";
import { MigrationError } from "../contract/errors.js";
import { type OutboxNames, quoteLiteral } from "../sql/names.js";

/** A migration file as shipped: its SQL still holds the `{{schema}}` and `{{channel}}` placeholders. */
export interface MigrationFile {
  version: number;
  name: string;
  /** sha256 of the file with line endings normalised, so a CRLF checkout does not look like drift. */
  checksum: string;
  template: string;
}

/** Resolves from both src/migrate (tsx) and dist/migrate (built): the folder sits at the package root. */
export const MIGRATIONS_DIR = fileURLToPath(new URL("../../migrations/", import.meta.url));

const FILE_NAME = /^(\d{4})_([a-z0-9_]+)\.sql$/;

export async function loadMigrationFiles(dir: string = MIGRATIONS_DIR): Promise<MigrationFile[]> {
  const entries = (await readdir(dir)).filter((f) => f.endsWith(".sql")).sort();
  const files: MigrationFile[] = [];
  for (const entry of entries) {
    const match = FILE_NAME.exec(entry);
    if (!match) {
      throw new MigrationError(`migration file "${entry}" must be named NNNN_name.sql (lower-case name)`);
    }
    const template = (await readFile(`${dir}/${entry}`, "utf8")).replaceAll("\r\n", "\n");
    const version = Number(match[1]);
    if (files.some((f) => f.version === version)) {
      throw new MigrationError(`two migration files have version ${version}`);
    }
    files.push({
      version,
      name: entry.replace(/\.sql$/, ""),
      checksum: createHash("sha256").update(template).digest("hex"),
      template,
    });
  }
  if (files.length === 0) throw new MigrationError(`no migration files in ${dir}`);
  return files;
}

/** The SQL of one migration for one schema. Only validated names are spliced in. */
export function renderMigration(file: MigrationFile, names: OutboxNames): string {
  return file.template
    .replaceAll("{{schema}}", names.quotedSchema)
    .replaceAll("{{channel}}", quoteLiteral(names.channel));
}
