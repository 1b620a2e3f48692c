import { availableParallelism } from "node:os";
import { defineConfig } from "vitest/config";

export default defineConfig({
  test: {
    include: ["test/**/*.test.ts"],
    globalSetup: ["test/support/setup/global-setup.ts"],
    // Timeouts only catch a hang; no test asserts time with them. Generous, so that a test that spawns
    // processes or starts servers on a busy 2-core machine (six CPU hogs beside the run) is slow, not failed.
    testTimeout: 120_000,
    hookTimeout: 120_000,
    // expect.poll waits on a condition; its default of 1 s is a wall-clock bound in disguise.
    expect: { poll: { timeout: 30_000 } },
    // The global teardown stops the embedded server, whose own stop timeout is 15 s.
    teardownTimeout: 30_000,
    pool: "forks",
    // Two files at a time even on 2 cores (Vitest's default there is one): most of a file's time is spent
    // waiting on Postgres, brokers and child processes, not computing, and files never share state (a
    // schema, application_name, server, port and temp folder of their own). VITEST_MAX_WORKERS or
    // --maxWorkers overrides.
    maxWorkers: Math.max(2, availableParallelism() - 1),
    reporters: ["default", "./test/support/setup/summary-reporter.ts"],
  },
});
