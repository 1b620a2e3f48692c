import { readFileSync } from "node:fs";
import { OutboxConfigError } from "../contract/errors.js";
import { registerSecrets, registerUrlSecrets, scrubSecrets } from "../util/redact.js";
import { UsageError } from "./args.js";
import { type CliIo, print, printError } from "./io.js";

export type { CliIo } from "./io.js";

interface Command {
  run(argv: string[], io: CliIo): Promise<number>;
  usage: string;
}

/**
 * The commands, each imported only when it runs (or its help is asked for): `--help`, `--version` and
 * an unknown command load no driver, no broker client, no worker.
 */
const commands: Record<string, { load: () => Promise<Command>; summary: string }> = {
  run: {
    load: async () => {
      const m = await import("./run-command.js");
      return { run: m.runCommand, usage: m.runUsage };
    },
    summary: "run the worker as a service (handlers module and/or relays)",
  },
  migrate: {
    load: async () => {
      const m = await import("./migrate-command.js");
      return { run: m.migrateCommand, usage: m.migrateUsage };
    },
    summary: "create or update the outbox schema (--print for SQL)",
  },
  trigger: {
    load: async () => {
      const m = await import("./trigger-command.js");
      return { run: m.triggerCommand, usage: m.triggerUsage };
    },
    summary: "enable/disable the wake-up trigger for plain-SQL producers",
  },
  grant: {
    load: async () => {
      const m = await import("./grant-command.js");
      return { run: m.grantCommand, usage: m.grantUsage };
    },
    summary: "grant least-privilege producer/worker/inspector roles (--print for SQL)",
  },
  status: {
    load: async () => {
      const m = await import("./status-command.js");
      return { run: m.statusCommand, usage: m.statusUsage };
    },
    summary: "per-queue counts and oldest ready age (lease-free)",
  },
  peek: {
    load: async () => {
      const m = await import("./peek-command.js");
      return { run: m.peekCommand, usage: m.peekUsage };
    },
    summary: "list waiting messages (lease-free, changes nothing)",
  },
  "dead-letters": {
    load: async () => {
      const m = await import("./dead-letters-command.js");
      return { run: m.deadLettersCommand, usage: m.deadLettersUsage };
    },
    summary: "list, show, replay or purge dead letters",
  },
  subscriptions: {
    load: async () => {
      const m = await import("./subscriptions-command.js");
      return { run: m.subscriptionsCommand, usage: m.subscriptionsUsage };
    },
    summary: "list who receives which topics (--for TOPIC: the queues an event would reach)",
  },
  subscribe: {
    load: async () => {
      const m = await import("./subscriptions-command.js");
      return { run: m.subscribeCommand, usage: m.subscribeUsage };
    },
    summary: "subscribe a queue to a topic or pattern (idempotent)",
  },
  unsubscribe: {
    load: async () => {
      const m = await import("./subscriptions-command.js");
      return { run: m.unsubscribeCommand, usage: m.unsubscribeUsage };
    },
    summary: "remove a queue's subscription (queued copies stay deliverable)",
  },
  healthcheck: {
    load: async () => {
      const m = await import("./healthcheck-command.js");
      return { run: m.healthcheckCommand, usage: m.healthcheckUsage };
    },
    summary: "ask a running service's /readyz (or /healthz): exit 0 when it answers 200",
  },
  asyncapi: {
    load: async () => {
      const m = await import("./asyncapi-command.js");
      return { run: m.asyncapiCommand, usage: m.asyncapiUsage };
    },
    summary: "print an AsyncAPI 3.0 document of your queues (and relays)",
  },
  schemas: {
    load: async () => {
      const m = await import("./schemas-command.js");
      return { run: m.schemasCommand, usage: m.schemasUsage };
    },
    summary: "write one JSON Schema per queue, for consumers in other languages",
  },
  demo: {
    load: async () => {
      const m = await import("./demo-command.js");
      return { run: m.demoCommand, usage: m.demoUsage };
    },
    summary: "zero-setup demo on an embedded Postgres",
  },
};

const nameWidth = Math.max(...Object.keys(commands).map((name) => name.length));

const usage = `Usage: outbox-worker <command> [options]

Commands:
${Object.entries(commands)
  .map(([name, c]) => `  ${name.padEnd(nameWidth)}  ${c.summary}`)
  .join("\n")}

Run "outbox-worker help <command>" or "outbox-worker <command> --help" for a command's options,
"outbox-worker --version" for the version.`;

/** The package's version, from its package.json: two levels up from both src/cli and dist/cli. */
function packageVersion(): string {
  const manifest = JSON.parse(readFileSync(new URL("../../package.json", import.meta.url), "utf8"));
  return String(manifest.version);
}

/** Everything a password could hide in, so no error we print can leak it (`run` adds its config's). */
function registerCommandSecrets(argv: readonly string[], env: NodeJS.ProcessEnv): void {
  for (const raw of [env.DATABASE_URL, ...argv]) {
    if (raw?.includes("://")) registerUrlSecrets(raw);
  }
  registerSecrets(env.PGPASSWORD);
}

/**
 * The whole command line: `outbox-worker <argv>`, writing through `io` and reading `io.env`. Returns the
 * exit code (0 done, 1 failed, 2 wrong command line or config) and never exits the process itself,
 * except `run` and `demo`, which own their process (signals, a second Ctrl-C, the final exit).
 * Everything it prints is scrubbed of the secrets it was given (DATABASE_URL, PGPASSWORD, URLs in argv).
 */
export async function main(argv: readonly string[], io: CliIo): Promise<number> {
  registerCommandSecrets(argv, io.env);
  const [name, ...rest] = argv;
  if (name === "-v" || name === "--version") {
    print(io, packageVersion());
    return 0;
  }
  if (name === "help" && rest[0] !== undefined) {
    const topic = Object.hasOwn(commands, rest[0]) ? commands[rest[0]] : undefined;
    if (!topic) {
      printError(io, `outbox-worker help: unknown command "${rest[0]}"\n\n${usage}`);
      return 2;
    }
    print(io, (await topic.load()).usage);
    return 0;
  }
  if (!name || name === "-h" || name === "--help" || name === "help") {
    print(io, usage);
    return name ? 0 : 2;
  }
  const entry = Object.hasOwn(commands, name) ? commands[name] : undefined;
  if (!entry) {
    printError(io, `outbox-worker: unknown command "${name}"\n\n${usage}`);
    return 2;
  }
  const command = await entry.load();
  try {
    return await command.run(rest, io);
  } catch (error) {
    const message = scrubSecrets(String((error as Error)?.message ?? error));
    if (error instanceof UsageError) {
      printError(io, `outbox-worker ${name}: ${message}\n\n${command.usage}`);
      return 2;
    }
    if (error instanceof OutboxConfigError) {
      printError(io, `outbox-worker ${name}: invalid ${message}`);
      return 2;
    }
    printError(io, `outbox-worker ${name}: ${message}`);
    return 1;
  }
}
