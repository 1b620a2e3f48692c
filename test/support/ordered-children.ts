import { type ChildProcess, spawn } from "node:child_process";
import path from "node:path";

/** A worker process of test/support/fixtures/ordered-worker.ts, with its exit and its "ready" line. */
export interface OrderedChild {
  id: string;
  process: ChildProcess;
  exited: Promise<number | null>;
  ready: Promise<void>;
}

/**
 * Starts ordered-worker.ts as WORKER_ID `id` with `env` (DATABASE_URL, OUTBOX_SCHEMA, its overrides), and
 * adds it to `children` (the caller kills what is left there after its tests). `ready` rejects if the
 * process exits first.
 */
export function startOrderedChild(
  id: string,
  env: Record<string, string>,
  children: OrderedChild[],
): OrderedChild {
  const child = spawn(
    process.execPath,
    ["--import", "tsx", path.resolve("test/support/fixtures/ordered-worker.ts")],
    { env: { ...process.env, WORKER_ID: id, ...env }, stdio: ["ignore", "pipe", "inherit"] },
  );
  const exited = new Promise<number | null>((resolve) => child.once("exit", (code) => resolve(code)));
  const ready = new Promise<void>((resolve, reject) => {
    let out = "";
    child.stdout?.on("data", (chunk: Buffer) => {
      out += chunk.toString();
      if (out.includes("ready\n")) resolve();
    });
    child.once("exit", (code, signal) => reject(new Error(`${id} exited before ready (${code ?? signal})`)));
  });
  ready.catch(() => {});
  const c = { id, process: child, exited, ready };
  children.push(c);
  return c;
}
