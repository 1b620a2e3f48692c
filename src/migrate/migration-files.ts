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
  /**
   * Marked `-- outbox:no-transaction` on its first line: its statements run one by one outside a transaction
   * (what `CREATE INDEX CONCURRENTLY` needs, so a live outbox keeps taking writes). Such a file must be safe
   * to re-run after a crash halfway: every statement idempotent (`IF NOT EXISTS`), no dollar quoting.
   */
  noTransaction: boolean;
}

const NO_TRANSACTION = /^-- outbox:no-transaction[ \t]*$/m;

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
    const noTransaction = NO_TRANSACTION.test(template.split("\n", 1)[0] ?? "");
    if (noTransaction && template.includes("$")) {
      throw new MigrationError(
        `migration file "${entry}" runs outside a transaction and so is split into statements at ";": it must not use dollar quoting`,
      );
    }
    files.push({
      version,
      name: entry.replace(/\.sql$/, ""),
      checksum: createHash("sha256").update(template).digest("hex"),
      template,
      noTransaction,
    });
  }
  if (files.length === 0) throw new MigrationError(`no migration files in ${dir}`);
  return files;
}

/** The SQL of one migration (or function file) for one schema. Only validated names are spliced in. */
export function renderMigration(file: Pick<MigrationFile, "template">, names: OutboxNames): string {
  return file.template
    .replaceAll("{{schema}}", names.quotedSchema)
    .replaceAll("{{channel}}", quoteLiteral(names.channel));
}

/** A no-transaction migration's statements, one per query (comments dropped, empty ones skipped). */
export function migrationStatementsOf(sql: string): string[] {
  return sql
    .split("\n")
    .filter((line) => !/^\s*--/.test(line))
    .join("\n")
    .split(";")
    .map((statement) => statement.trim())
    .filter((statement) => statement.length > 0);
}
