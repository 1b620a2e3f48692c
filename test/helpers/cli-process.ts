import { type ChildProcess, spawn } from "node:child_process";
import path from "node:path";

/** The CLI as a real process (node with tsx as a loader, so signals reach the process itself). */
export interface CliProcess {
  child: ChildProcess;
  output(): string;
  /** Resolves with the first line containing `text`, or rejects after the timeout. */
  waitFor(text: string, timeoutMs?: number): Promise<string>;
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
}

export function startCli(args: string[], env: Record<string, string | undefined>, cwd?: string): CliProcess {
  // The loader by absolute URL: a test may run the CLI from a folder where "tsx" does not resolve.
  const child = spawn(
    process.execPath,
    ["--import", import.meta.resolve("tsx"), path.resolve("src/cli/main.ts"), ...args],
    {
      cwd,
      env: { ...process.env, DATABASE_URL: undefined, ...env },
      stdio: ["ignore", "pipe", "pipe"],
    },
  );
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
    waitFor(text, timeoutMs = 20_000) {
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
