import { readdir, readFile, rm } from "node:fs/promises";
import path from "node:path";

// No vitest import: the global setup (outside any test worker) uses this too.

/**
 * Removes a temp folder, first stopping any Postgres still running on a data folder inside it: a CLI child
 * killed with SIGKILL (or timed out) leaves its embedded server running, and deleting its data folder
 * would not stop it. Never throws for a server that will not stop; the rm still runs.
 */
export async function removeTempDir(dir: string, depth = 2): Promise<void> {
  for (const pid of await postmasterPids(dir, depth)) await stopProcess(pid);
  await rm(dir, { recursive: true, force: true, maxRetries: 10, retryDelay: 100 });
}

/** The live postmasters whose postmaster.pid lies in `dir` or up to `depth` folders below it. */
async function postmasterPids(dir: string, depth: number): Promise<number[]> {
  const pids: number[] = [];
  const text = await readFile(path.join(dir, "postmaster.pid"), "utf8").catch(() => undefined);
  const pid = Number(text?.split("\n")[0]);
  if (Number.isInteger(pid) && pid > 0 && alive(pid)) {
    // A pid reused by something else since is left alone.
    const cmdline = await readFile(`/proc/${pid}/cmdline`, "utf8").catch(() => "");
    if (!cmdline || cmdline.includes("postgres")) pids.push(pid);
  }
  if (depth > 0) {
    const entries = await readdir(dir, { withFileTypes: true }).catch(() => []);
    for (const entry of entries) {
      if (entry.isDirectory()) pids.push(...(await postmasterPids(path.join(dir, entry.name), depth - 1)));
    }
  }
  return pids;
}

/** SIGINT (Postgres' fast shutdown), then SIGKILL after 10 s. */
async function stopProcess(pid: number): Promise<void> {
  signal(pid, "SIGINT");
  const deadline = Date.now() + 10_000;
  while (alive(pid) && Date.now() < deadline) await new Promise((resolve) => setTimeout(resolve, 50));
  if (alive(pid)) signal(pid, "SIGKILL");
}

function signal(pid: number, name: NodeJS.Signals): void {
  try {
    process.kill(pid, name);
  } catch {
    // already gone
  }
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === "EPERM";
  }
}
