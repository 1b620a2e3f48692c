import { type ChildProcess, execFile, spawn } from "node:child_process";
import path from "node:path";
import { promisify } from "node:util";

const exec = promisify(execFile);

/**
 * The built CLI, dist/cli/main.js, which the global setup builds once per run (test/support/setup/global-setup.ts).
 * Plain node, no loader: it starts far faster than the sources under tsx. A TypeScript handlers or config
 * module gets the project's tsx from the CLI itself (src/service/user-module.ts), as an installed CLI does.
 */
export const BUILT_CLI = path.resolve("dist/cli/main.js");

/** The CLI as a real process (plain node on the build, so signals reach the process itself). */
export interface CliProcess {
  child: ChildProcess;
  output(): string;
  /** Resolves with the first line containing `text`, or rejects after the timeout. */
  waitFor(text: string, timeoutMs?: number): Promise<string>;
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
}

export function startCli(args: string[], env: Record<string, string | undefined>, cwd?: string): CliProcess {
  const child = spawn(process.execPath, [BUILT_CLI, ...args], {
    cwd,
    env: { ...process.env, DATABASE_URL: undefined, ...env },
    stdio: ["ignore", "pipe", "pipe"],
  });
  let out = "";
  const listeners = new Set<() => void>();
  const onData = (chunk: Buffer) => {
    out += chunk.toString();
    for (const l of [...listeners]) l();
  };
  child.stdout?.on("data", onData);
  child.stderr?.on("data", onData);
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) =>
    child.once("exit", (code, signal) => {
      for (const l of [...listeners]) l();
      resolve({ code, signal });
    }),
  );
  return {
    child,
    output: () => out,
    exited,
    waitFor(text, timeoutMs = 60_000) {
      return new Promise((resolve, reject) => {
        const check = () => {
          const line = out.split("\n").find((l) => l.includes(text));
          if (line !== undefined) {
            done();
            resolve(line);
          } else if (child.exitCode !== null) {
            done();
            reject(new Error(`process exited (${child.exitCode}) before printing "${text}":\n${out}`));
          }
        };
        const timer = setTimeout(() => {
          done();
          reject(new Error(`no "${text}" within ${timeoutMs} ms:\n${out}`));
        }, timeoutMs);
        const done = () => {
          clearTimeout(timer);
          listeners.delete(check);
        };
        listeners.add(check);
        check();
      });
    },
  };
}

/** A service test's environment: its database and schema, JSON logs, fast polling; `more` overrides. */
export function serviceEnv(
  db: { url: string; schema: string },
  more: Record<string, string | undefined> = {},
): Record<string, string | undefined> {
  return {
    DATABASE_URL: db.url,
    OUTBOX_SCHEMA: db.schema,
    OUTBOX_LOG_PRETTY: "false",
    OUTBOX_MIN_POLL_INTERVAL_MS: "20",
    OUTBOX_MAX_POLL_INTERVAL_MS: "200",
    ...more,
  };
}

/** The built CLI run to its end in a child process (`execFile`); never throws on a non-zero exit. */
export async function execCli(
  args: string[],
  env: Record<string, string | undefined>,
  options: { cwd?: string; timeoutMs?: number } = {},
): Promise<{ code: number; stdout: string; stderr: string }> {
  try {
    const { stdout, stderr } = await exec(process.execPath, [BUILT_CLI, ...args], {
      cwd: options.cwd,
      env: { ...process.env, DATABASE_URL: undefined, ...env },
      timeout: options.timeoutMs ?? 60_000,
    });
    return { code: 0, stdout, stderr };
  } catch (error) {
    const e = error as { code: number; stdout: string; stderr: string };
    return { code: e.code, stdout: e.stdout, stderr: e.stderr };
  }
}
