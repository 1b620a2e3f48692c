import { EmbeddedPostgresError, EmbeddedPostgresNotInstalledError } from "../embedded/embedded-postgres.js";
import { ConfigError, loadServiceConfig } from "../service/config.js";
import { createLogger } from "../service/logger.js";
import { startService } from "../service/service.js";
import { StartupError } from "../service/startup.js";
import { redactConnectionString } from "../util/redact.js";
import { parseCommandArgs, UsageError } from "./args.js";
import { type CliIo, print, printError } from "./io.js";
import { npmShellParent, watchParent } from "./npm-parent.js";

export const runUsage = `Usage: outbox-worker run [--config FILE] [--handlers MODULE] [options]

Run the worker as a service: deliver outbox rows to the handlers in MODULE and/or to the built-in relays
in the config. Without DATABASE_URL it starts an embedded Postgres in ./.outbox-data (and migrates it).
SIGTERM or SIGINT stops gracefully (exit 0); a second signal exits at once; a fatal failure exits 1.
Where signals matter (a container, a supervisor), start the binary itself, not through npx or an npm
script: \`exec outbox-worker run …\` (npm passes SIGTERM to its shell, which does not pass it on).

Options (each also settable in the config file and the environment; see docs/operate/configuration.md):
  --config FILE        JSON, or a JS/TS module exporting the config (default: OUTBOX_CONFIG)
  --handlers MODULE    module exporting { "queue": handler, ... } (OUTBOX_HANDLERS)
  --database-url URL   Postgres connection string (DATABASE_URL)
  --schema NAME        outbox schema (OUTBOX_SCHEMA, default outbox)
  --http-port N        serve /healthz, /readyz, /relays and /metrics on port N (OUTBOX_HTTP_PORT)
  --log-level LEVEL    fatal, error, warn, info, debug, trace, silent (OUTBOX_LOG_LEVEL)
  --migrate            apply migrations before starting (OUTBOX_MIGRATE)
  -h, --help           show this help`;

export async function runCommand(argv: string[], io: CliIo): Promise<number> {
  const { values } = parseCommandArgs(argv, {
    config: { type: "string" },
    handlers: { type: "string" },
    "database-url": { type: "string" },
    schema: { type: "string" },
    "http-port": { type: "string" },
    "log-level": { type: "string" },
    migrate: { type: "boolean" },
  });
  if (values.help) {
    print(io, runUsage);
    return 0;
  }
  const port = values["http-port"];
  if (port !== undefined && !/^\d+$/.test(String(port))) {
    throw new UsageError(`--http-port must be a port number, got ${JSON.stringify(port)}`);
  }
  let config: Awaited<ReturnType<typeof loadServiceConfig>>;
  try {
    config = await loadServiceConfig({
      file: (values.config as string | undefined) ?? io.env.OUTBOX_CONFIG,
      env: io.env,
      overrides: {
        handlers: values.handlers,
        databaseUrl: values["database-url"],
        schema: values.schema,
        "http.port": port === undefined ? undefined : Number(port),
        "log.level": values["log-level"],
        migrate: values.migrate,
      },
    });
  } catch (error) {
    if (error instanceof ConfigError) {
      printError(io, `outbox-worker run: ${error.message}`);
      return 2;
    }
    throw error;
  }

  const log = createLogger(config.log);
  // Signals are caught from the very start: one that arrives while starting stops right after.
  let signalled: NodeJS.Signals | "parent exited" | undefined;
  let onStopRequested: (() => void) | undefined;
  const onSignal = (signal: NodeJS.Signals) => {
    if (signalled) {
      // The operator asked twice: leave now; leases of running handlers expire and are retried.
      log.warn({ signal }, "second signal: exiting at once");
      process.exit(signal === "SIGINT" ? 130 : 143);
    }
    signalled = signal;
    log.info({ signal }, "stopping gracefully (send the signal again to exit at once)");
    onStopRequested?.();
  };
  process.on("SIGTERM", onSignal);
  process.on("SIGINT", onSignal);
  const npmShell = npmShellParent(io.env);
  if (npmShell) {
    log.warn(
      { shell: npmShell.shell, script: npmShell.script },
      "started by npm through a shell, which does not pass SIGTERM on: start it as `exec outbox-worker run …` where signals matter (docs/operate/service.md: Signals)",
    );
    if (npmShell.npmPid === 1) {
      log.error(
        "npm is PID 1 here (a container): on SIGTERM it exits at once and this worker dies with it, mid-delivery; start the worker itself (docs/operate/service.md: Signals)",
      );
    }
    // npm stopped: its shell died of the signal meant for us. A stop request, not a signal: Ctrl-C
    // reaches us and the shell alike, and must not count twice.
    watchParent(() => {
      if (signalled) return;
      signalled = "parent exited";
      log.warn(
        { parent: npmShell.pid },
        "npm's shell exited (npm was stopped; the signal never reached this worker): stopping gracefully",
      );
      onStopRequested?.();
    });
  }

  let service: Awaited<ReturnType<typeof startService>>;
  try {
    service = await startService(config, log);
  } catch (error) {
    // No database to use (the Docker image has no embedded Postgres): a config error, not a failure.
    if (error instanceof ConfigError || error instanceof EmbeddedPostgresNotInstalledError) {
      printError(io, `outbox-worker run: ${error.message}`);
      return 2;
    }
    if (error instanceof StartupError || error instanceof EmbeddedPostgresError) {
      // One line says what to fix; a stack trace would only bury it.
      log.fatal({ reason: error.message }, "could not start");
      printError(io, `outbox-worker run: ${error.message}`);
      return 1;
    }
    log.fatal({ err: error }, "could not start");
    return 1;
  }
  log.info(
    {
      database: config.databaseUrl ? redactConnectionString(config.databaseUrl) : "embedded",
      http: service.httpPort,
    },
    "outbox-worker running",
  );

  const code = await new Promise<number>((resolve) => {
    const stop = () => {
      service.stop().then(
        (result) => {
          if (!result.drained) {
            log.warn(
              { abandoned: result.abandoned },
              "stopped without draining: leases of aborted handlers will expire",
            );
          }
          resolve(0);
        },
        (error) => {
          log.error({ err: error }, "error while stopping");
          resolve(1);
        },
      );
    };
    if (signalled) stop();
    else onStopRequested = stop;
    service.worker.wait().catch(async (error: Error) => {
      if (signalled) return;
      log.fatal({ err: error }, `worker gave up: ${error.message}`);
      await service.stop().catch(() => {});
      resolve(1);
    });
  });
  // Broker clients and timers of our own are closed; exit now rather than wait on anything left open.
  process.exit(code);
}
