import type { Reporter, TestModule } from "vitest/node";

/**
 * Ends every run with the plain line `N passed, N failed[, N skipped]`, which CI reads. A file that fails
 * to load counts as one failure, so a broken import can never look like a clean run.
 */
export default class SummaryReporter implements Reporter {
  onTestRunEnd(testModules: ReadonlyArray<TestModule>, unhandledErrors: ReadonlyArray<unknown>): void {
    let passed = 0;
    let failed = unhandledErrors.length;
    let skipped = 0;
    for (const module of testModules) {
      if (module.state() === "failed" && [...module.children.allTests()].length === 0) failed++;
      for (const test of module.children.allTests()) {
        const state = test.result().state;
        if (state === "passed") passed++;
        else if (state === "failed") failed++;
        else skipped++;
      }
    }
    const line = `${passed} passed, ${failed} failed${skipped ? `, ${skipped} skipped` : ""}`;
    process.stdout.write(`\n${line}\n`);
  }
}
