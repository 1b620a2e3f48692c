#!/usr/bin/env node
// The `outbox-worker` binary: a thin wrapper around main(argv, io) in program.ts, which tests call in-process.
import { format } from "node:util";
import { scrubSecrets } from "../util/redact.js";
import { processIo } from "./io.js";
import { main } from "./program.js";

/**
 * Whatever still prints through the console (the service's own lines, the demo's tables) goes through
 * scrubSecrets too, as everything main prints does.
 */
function scrubConsole(): void {
  for (const method of ["log", "info", "warn", "error"] as const) {
    const print = console[method].bind(console);
    console[method] = (...args: unknown[]) => print(scrubSecrets(format(...args)));
  }
}

// A reader that goes away (`outbox-worker migrate --print | head`) is not an error of ours.
process.stdout.on("error", (error: NodeJS.ErrnoException) => {
  if (error.code === "EPIPE") process.exit(0);
  throw error;
});

scrubConsole();
process.exitCode = await main(process.argv.slice(2), processIo());
