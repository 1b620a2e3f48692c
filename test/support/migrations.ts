import { readdirSync } from "node:fs";
import { copyFile, readdir } from "node:fs/promises";
import path from "node:path";
import { MIGRATIONS_DIR } from "../../src/migrate/migration-files.js";
import { testTempDir } from "./temp-dir.js";

/**
 * A migrations folder holding the shipped files up to `version`, byte for byte (so a later full `migrate`
 * sees them as applied): a schema as an older release left it. Removed when the current test finishes.
 */
export async function shippedMigrationsUpTo(version: number): Promise<string> {
  const dir = await testTempDir("outbox-migrations-");
  for (const file of await readdir(MIGRATIONS_DIR)) {
    if (/^\d{4}_\w+\.sql$/.test(file) && Number(file.slice(0, 4)) <= version) {
      await copyFile(path.join(MIGRATIONS_DIR, file), path.join(dir, file));
    }
  }
  return dir;
}

/** The shipped migrations' versions, in order (numbers may be skipped: each piece of work takes its own). */
const VERSIONS = readdirSync(MIGRATIONS_DIR)
  .filter((f) => /^\d{4}_\w+\.sql$/.test(f))
  .map((f) => Number(f.slice(0, 4)))
  .sort((a, b) => a - b);

/** The latest shipped migration's version. */
export const LATEST_VERSION = Math.max(...VERSIONS);

/** The versions a migrate from `after` up to the latest applies, in order. */
export const versionsAfter = (after: number): number[] => VERSIONS.filter((v) => v > after);
