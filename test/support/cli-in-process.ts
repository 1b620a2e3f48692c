import { main } from "../../src/cli/program.js";

export interface CliResult {
  code: number;
  stdout: string;
  stderr: string;
}

/**
 * The CLI in this process: `main(argv, io)`, as the `outbox-worker` binary calls it, with writers that
 * collect what it prints. `env` is the whole environment the command sees (pass `{ ...process.env, ... }`
 * for the process's). Exit code and output are the binary's; `run` and `demo`, which own their process
 * (signals, exit), stay on child processes (test/support/cli-process.ts).
 */
export async function runCli(args: string[], env: NodeJS.ProcessEnv): Promise<CliResult> {
  let stdout = "";
  let stderr = "";
  const code = await main(args, {
    stdout: (text) => {
      stdout += text;
    },
    stderr: (text) => {
      stderr += text;
    },
    env,
  });
  return { code, stdout, stderr };
}
