import { chmod, mkdtemp } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { onTestFinished } from "vitest";
import { removeTempDir } from "./remove-temp-dir.js";

/**
 * A new folder under os.tmpdir() named `<prefix>XXXXXX`, removed when the current test finishes, passed or
 * failed (so call it inside a test). `mode`: as root an embedded Postgres or PgBouncer runs as "postgres",
 * which must be able to enter the folder (0o755).
 */
export async function testTempDir(prefix: string, mode?: number): Promise<string> {
  const dir = await mkdtemp(path.join(tmpdir(), prefix));
  onTestFinished(() => removeTempDir(dir));
  if (mode !== undefined) await chmod(dir, mode);
  return dir;
}
