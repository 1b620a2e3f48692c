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
    reporters: ["default", "./test/setup/summary-reporter.ts"],
  },
});
