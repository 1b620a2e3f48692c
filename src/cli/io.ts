import { format } from "node:util";
import { scrubSecrets } from "../util/redact.js";

/**
 * Where a command writes and which environment it reads. The installed CLI passes the process's own
 * (processIo); tests pass writers that collect the text, so a command runs in-process like a user's.
 */
export interface CliIo {
  /** Writes text to standard output as it is (no newline added, no scrubbing). */
  stdout(text: string): void;
  /** Writes text to standard error as it is. */
  stderr(text: string): void;
  /** The environment the command reads (DATABASE_URL, OUTBOX_*, PG*). */
  env: NodeJS.ProcessEnv;
}

/** The process's streams and environment: what `outbox-worker` itself uses. */
export function processIo(): CliIo {
  return {
    stdout: (text) => process.stdout.write(text),
    stderr: (text) => process.stderr.write(text),
    env: process.env,
  };
}

/** console.log through io: the same text (util.format, then a newline), scrubbed of secrets. */
export function print(io: CliIo, ...args: unknown[]): void {
  io.stdout(`${scrubSecrets(format(...args))}\n`);
}

/** console.error through io: the same text, scrubbed of secrets, on standard error. */
export function printError(io: CliIo, ...args: unknown[]): void {
  io.stderr(`${scrubSecrets(format(...args))}\n`);
}
