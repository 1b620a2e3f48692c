import { chmod, mkdtemp, readdir } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { removeTempDir } from "../remove-temp-dir.js";

/**
 * Entries a run may leave in its temp folder without failing: caches of the tools that run the CLI in
 * child processes (tsx keeps its transform cache in `<tmpdir>/tsx-<uid>`). They go with the folder.
 */
const TOOL_CACHES = [/^tsx-\d+$/];

export interface TempGuard {
  /** The run's private temp folder. */
  readonly dir: string;
  /** Restores TMPDIR, removes the folder, and throws naming whatever the tests left in it. */
  check(): Promise<void>;
}

/**
 * Fails a run whose tests leave temp folders or files behind.
 *
 * Why a private TMPDIR rather than comparing /tmp before and after: /tmp is shared with other runs (other
 * engineers on the same machine, other checkouts, CI jobs on one host) that create and remove folders with
 * these very prefixes at the same time, so neither names nor mtimes there can tell this run's leftovers
 * from theirs. Instead the global setup points TMPDIR (os.tmpdir() reads it on every call) at a folder of
 * its own before any test worker starts; the workers inherit it, and so do the processes they spawn (CLI,
 * embedded Postgres and its initdb password file, PgBouncer). Whatever is in that folder at the end was
 * made by this run and by nothing else, whatever its prefix. The folder is removed either way, so a leak
 * fails the run without piling up in /tmp; only a run killed before its teardown leaves it
 * (`outbox-test-run-*`).
 */
export async function startTempGuard(): Promise<TempGuard> {
  const hadTmpdir = Object.hasOwn(process.env, "TMPDIR");
  const previous = process.env.TMPDIR;
  const dir = await mkdtemp(path.join(tmpdir(), "outbox-test-run-"));
  // As root, embedded Postgres and PgBouncer run as "postgres", which must enter the folders made in it.
  await chmod(dir, 0o755);
  process.env.TMPDIR = dir;
  return {
    dir,
    async check() {
      if (hadTmpdir) process.env.TMPDIR = previous;
      else delete process.env.TMPDIR;
      const entries = await readdir(dir).catch(() => [] as string[]);
      const left = entries.filter((name) => !TOOL_CACHES.some((cache) => cache.test(name))).sort();
      // Deep enough for <dir>/outbox-run-*/data/postmaster.pid: a server a killed CLI left running.
      await removeTempDir(dir, 3);
      if (left.length > 0) {
        // Vitest only logs a teardown's error ("error during close") and still exits 0: fail the run here.
        process.exitCode = 1;
        throw new Error(
          `the tests left ${left.length} temp folder(s)/file(s) behind in os.tmpdir() (removed now): ${left.join(", ")}. ` +
            "Each test must remove what it creates, even when it fails: see test/support/temp-dir.ts.",
        );
      }
    },
  };
}
