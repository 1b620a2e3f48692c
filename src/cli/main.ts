#!/usr/bin/env node
import { readFileSync } from "node:fs";
import { format } from "node:util";
import { OutboxConfigError } from "../contract/errors.js";
import { registerSecrets, registerUrlSecrets, scrubSecrets } from "../util/redact.js";
import { UsageError } from "./args.js";
import { deadLettersCommand, deadLettersUsage } from "./dead-letters-command.js";
import { demoCommand, demoUsage } from "./demo-command.js";
import { healthcheckCommand, healthcheckUsage } from "./healthcheck-command.js";
import { migrateCommand, migrateUsage } from "./migrate-command.js";
import { peekCommand, peekUsage } from "./peek-command.js";
import { runCommand, runUsage } from "./run-command.js";
import { statusCommand, statusUsage } from "./status-command.js";
import { triggerCommand, triggerUsage } from "./trigger-command.js";

const commands: Record<string, { run: (argv: string[]) => Promise<number>; usage: string; summary: string }> =
  {
    run: {
      run: runCommand,
      usage: runUsage,
      summary: "run the worker as a service (handlers module and/or relays)",
    },
    migrate: {
      run: migrateCommand,
      usage: migrateUsage,
      summary: "create or update the outbox schema (--print for SQL)",
    },
    trigger: {
      run: triggerCommand,
      usage: triggerUsage,
      summary: "enable/disable the wake-up trigger for plain-SQL producers",
    },
    status: {
      run: statusCommand,
      usage: statusUsage,
      summary: "per-queue counts and oldest ready age (lease-free)",
    },
    peek: {
      run: peekCommand,
      usage: peekUsage,
      summary: "list waiting messages (lease-free, changes nothing)",
    },
    "dead-letters": {
      run: deadLettersCommand,
      usage: deadLettersUsage,
      summary: "list, show, replay or purge dead letters",
    },
    healthcheck: {
      run: healthcheckCommand,
      usage: healthcheckUsage,
      summary: "ask a running service's /readyz (or /healthz): exit 0 when it answers 200",
    },
    demo: { run: demoCommand, usage: demoUsage, summary: "zero-setup demo on an embedded Postgres" },
  };

const usage = `Usage: outbox-worker <command> [options]

Commands:
${Object.entries(commands)
  .map(([name, c]) => `  ${name.padEnd(13)} ${c.summary}`)
  .join("\n")}

Run "outbox-worker help <command>" or "outbox-worker <command> --help" for a command's options,
"outbox-worker --version" for the version.`;

/** The package's version, from its package.json: two levels up from both src/cli and dist/cli. */
function packageVersion(): string {
  const manifest = JSON.parse(readFileSync(new URL("../../package.json", import.meta.url), "utf8"));
  return String(manifest.version);
}

/** Everything a password could hide in, so no error we print can leak it (`run` adds its config's). */
function registerProcessSecrets(): void {
  for (const raw of [process.env.DATABASE_URL, ...process.argv]) {
    if (raw?.includes("://")) registerUrlSecrets(raw);
  }
  registerSecrets(process.env.PGPASSWORD);
}

/**
 * Everything the CLI prints goes through scrubSecrets: errors, and rows it shows (last_error, dead-letter
 * errors, payloads) that may hold a credential written before redaction existed or by another process.
 */
function scrubConsole(): void {
  for (const method of ["log", "info", "warn", "error"] as const) {
    const print = console[method].bind(console);
    console[method] = (...args: unknown[]) => print(scrubSecrets(format(...args)));
  }
}

async function main(argv: string[]): Promise<number> {
  const [name, ...rest] = argv;
  if (name === "-v" || name === "--version") {
    console.log(packageVersion());
    return 0;
  }
  if (name === "help" && rest[0] !== undefined) {
    const topic = commands[rest[0]];
    if (!topic) {
      console.error(`outbox-worker help: unknown command "${rest[0]}"\n\n${usage}`);
      return 2;
    }
    console.log(topic.usage);
    return 0;
  }
  if (!name || name === "-h" || name === "--help" || name === "help") {
    console.log(usage);
    return name ? 0 : 2;
  }
  const command = commands[name];
  if (!command) {
    console.error(`outbox-worker: unknown command "${name}"\n\n${usage}`);
    return 2;
  }
  try {
    return await command.run(rest);
  } catch (error) {
    const message = scrubSecrets(String((error as Error)?.message ?? error));
    if (error instanceof UsageError) {
      console.error(`outbox-worker ${name}: ${message}\n\n${command.usage}`);
      return 2;
    }
    if (error instanceof OutboxConfigError) {
      console.error(`outbox-worker ${name}: invalid ${message}`);
      return 2;
    }
    console.error(`outbox-worker ${name}: ${message}`);
    return 1;
  }
}

// A reader that goes away (`outbox-worker migrate --print | head`) is not an error of ours.
process.stdout.on("error", (error: NodeJS.ErrnoException) => {
  if (error.code === "EPIPE") process.exit(0);
  throw error;
});

registerProcessSecrets();
scrubConsole();
process.exitCode = await main(process.argv.slice(2));
