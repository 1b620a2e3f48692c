import { availableParallelism } from "node:os";
import { defineConfig } from "vitest/config";

export default defineConfig({
  test: {
    include: ["test/**/*.test.ts"],
    globalSetup: ["test/setup/global-setup.ts"],
    testTimeout: 30_000,
    hookTimeout: 60_000,
    // The global teardown stops the embedded server, whose own stop timeout is 15 s.
    teardownTimeout: 30_000,
    pool: "forks",
    // Two files at a time even on 2 cores (Vitest's default there is one): most of a file's time is spent
    // waiting on Postgres, brokers and child processes, not computing, and files never share state (a
    // schema, application_name, server, port and temp folder of their own). VITEST_MAX_WORKERS or
    // --maxWorkers overrides.
    maxWorkers: Math.max(2, availableParallelism() - 1),
    reporters: ["default", "./test/setup/summary-reporter.ts"],
  },
});
