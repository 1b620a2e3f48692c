import type { Reporter, TestModule } from "vitest/node";

/**
 * Ends every run with the plain line `N passed, N failed[, N skipped]`, which CI reads. A file that fails
 * to load counts as one failure, so a broken import can never look like a clean run. Each failure is named
 * just above that line (`FAILED file > test: first line of the error`), so a log cut to its last lines
 * still says what failed.
 */
export default class SummaryReporter implements Reporter {
  onTestRunEnd(testModules: ReadonlyArray<TestModule>, unhandledErrors: ReadonlyArray<unknown>): void {
    let passed = 0;
    let failed = unhandledErrors.length;
    let skipped = 0;
    const failures: string[] = unhandledErrors.map(
      (error) => `FAILED (unhandled error): ${firstLine(error)}`,
    );
    for (const module of testModules) {
      if (module.state() === "failed" && [...module.children.allTests()].length === 0) {
        failed++;
        failures.push(`FAILED ${module.moduleId}: ${firstLine(module.errors()[0])}`);
      }
      for (const test of module.children.allTests()) {
        const result = test.result();
        if (result.state === "passed") passed++;
        else if (result.state === "failed") {
          failed++;
          failures.push(
            `FAILED ${module.relativeModuleId} > ${test.fullName}: ${firstLine(result.errors?.[0])}`,
          );
        } else skipped++;
      }
    }
    const line = `${passed} passed, ${failed} failed${skipped ? `, ${skipped} skipped` : ""}`;
    process.stdout.write(`\n${failures.map((f) => `${f}\n`).join("")}${line}\n`);
  }
}

function firstLine(error: unknown): string {
  const message =
    error && typeof error === "object" && "message" in error ? String(error.message) : String(error ?? "");
  return (message.split("\n")[0] ?? "").slice(0, 300);
}
