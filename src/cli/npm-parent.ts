import { readFileSync } from "node:fs";
import path from "node:path";

/**
 * `npx outbox-worker run` and an npm script `"start": "outbox-worker run"` start the worker as
 * npm → `sh -c '…'` → node. npm passes SIGTERM and SIGINT on to its child, the shell, which dies of it
 * without passing it on (dash does not exec a lone command): the worker never hears the signal. Started
 * as `exec outbox-worker run` (or the binary itself) the worker is npm's child, and the signal arrives.
 */

/** The npm-started shell this process runs under, or undefined (not under npm, exec'd, or not Linux). */
export function npmShellParent(
  env: NodeJS.ProcessEnv,
  ppid: number = process.ppid,
): { pid: number; shell: string; script: string; npmPid: number | undefined } | undefined {
  // npm sets it for the script it runs (npx: the quoted binary name); a grandchild inherits it too, so
  // the parent's command line must also be that very script.
  const lifecycleScript = env.npm_lifecycle_script;
  if (!lifecycleScript) return undefined;
  let argv: string[];
  try {
    argv = readFileSync(`/proc/${ppid}/cmdline`, "utf8").split("\0");
  } catch {
    return undefined;
  }
  const [shell = "", flag, script = ""] = argv;
  if (!/^(?:ba|da|k|z|a)?sh$/.test(path.basename(shell)) || flag !== "-c") return undefined;
  if (!script.startsWith(lifecycleScript)) return undefined;
  return { pid: ppid, shell, script, npmPid: parentOf(ppid) };
}

/** A process's parent by /proc/PID/stat (the field after the state, past the parenthesised name). */
function parentOf(pid: number): number | undefined {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    const parent = Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1]);
    return Number.isInteger(parent) ? parent : undefined;
  } catch {
    return undefined;
  }
}

/**
 * Calls `onGone` once when this process's parent exits (it is then re-parented). Checks every
 * `intervalMs`; the timer does not keep the process alive. Returns a function that stops watching.
 */
export function watchParent(onGone: () => void, intervalMs = 250): () => void {
  const parent = process.ppid;
  const timer = setInterval(() => {
    if (process.ppid === parent) return;
    clearInterval(timer);
    onGone();
  }, intervalMs);
  timer.unref();
  return () => clearInterval(timer);
}
