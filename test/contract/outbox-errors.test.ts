import { readdirSync, readFileSync } from "node:fs";
import path from "node:path";
import { describe, expect, it } from "vitest";
import { UsageError } from "../../src/cli/args.js";
import { BadRequest } from "../../src/console/api.js";
import { OutboxError } from "../../src/contract/errors.js";
import { PermanentError, TransientError } from "../../src/contract/handler-errors.js";
import { transactionKysely } from "../../src/contract/transaction-kysely.js";
import { KeyBusyError } from "../../src/dispatch/ack-transaction.js";
import { LocalQueue } from "../../src/dispatch/local-queue.js";
import { HandlerTimeoutError } from "../../src/dispatch/timeout.js";
import { MalformedEventError } from "../../src/inbox/event.js";
import { ConfigError } from "../../src/service/config.js";
import { StartupError } from "../../src/service/startup.js";
import { timeBound } from "../../src/service/time-bound.js";

/** Every error this package throws on purpose is an OutboxError, so callers can tell ours from the driver's. */

function sources(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((entry) => {
    const full = path.join(dir, entry.name);
    if (entry.isDirectory()) return sources(full);
    return entry.name.endsWith(".ts") ? [full] : [];
  });
}

/** Code that runs in the browser, where the package's classes do not exist. */
const BROWSER_CODE = "src/console/browser/";

/** `x instanceof Error ? x : new Error(String(x))`: a foreign thrown value made an Error, not an error of ours. */
const WRAPS_A_THROWN_VALUE = /new Error\(String\(/;

describe("OutboxError everywhere", () => {
  it("src/ makes no plain Error of its own (only wraps a non-Error thrown value)", () => {
    const found: string[] = [];
    for (const file of sources("src")) {
      if (file.split(path.sep).join("/").startsWith(BROWSER_CODE)) continue;
      readFileSync(file, "utf8")
        .split("\n")
        .forEach((line, i) => {
          if (/\bnew Error\(/.test(line) && !WRAPS_A_THROWN_VALUE.test(line))
            found.push(`${file}:${i + 1}: ${line.trim()}`);
        });
    }
    expect(found).toEqual([]);
  });

  it("src/ throws a RangeError or TypeError only where its own caller turns it into an error of ours", () => {
    // The CLI and console turn a bad duration into a UsageError or BadRequest; json-error's depth stop is
    // caught where it is thrown; wire/ depends on nothing, and decodeHeaderValue documents its TypeError;
    // a LocalQueue overflow is a bug of the engine, never a caller's mistake.
    const internal = [
      "src/util/duration.ts",
      "src/util/json-error.ts",
      "src/wire/header-encoding.ts",
      "src/dispatch/local-queue.ts",
    ];
    const found: string[] = [];
    for (const file of sources("src")) {
      const name = file.split(path.sep).join("/");
      if (name.startsWith(BROWSER_CODE) || internal.includes(name)) continue;
      readFileSync(file, "utf8")
        .split("\n")
        .forEach((line, i) => {
          if (/\bnew (?:Range|Type)Error\(/.test(line)) found.push(`${name}:${i + 1}: ${line.trim()}`);
        });
    }
    expect(found).toEqual([]);
  });

  it("src/ has no error class outside OutboxError but the two that handlers throw", () => {
    const found: string[] = [];
    for (const file of sources("src")) {
      for (const match of readFileSync(file, "utf8").matchAll(
        /class (\w+) extends (?:Type|Range)?Error\b/g,
      )) {
        found.push(match[1] ?? "");
      }
    }
    // The handler's own verdicts: thrown by user code, not by this package.
    expect(found.sort()).toEqual(["OutboxError", "PermanentError", "TransientError"]);
  });

  it("the package's error classes are OutboxErrors, the handlers' are not", () => {
    for (const error of [
      new UsageError("x"),
      new ConfigError(["x"]),
      new StartupError("x"),
      new MalformedEventError("id", "missing"),
      new BadRequest("x"),
      new HandlerTimeoutError(5),
      new KeyBusyError(),
    ]) {
      expect(error, error.name).toBeInstanceOf(OutboxError);
    }
    expect(new PermanentError("x")).not.toBeInstanceOf(OutboxError);
    expect(new TransientError("x")).not.toBeInstanceOf(OutboxError);
  });

  it("transactionKysely on a queue without a transaction throws an OutboxError", () => {
    expect(() => transactionKysely({ queue: "plain", transaction: undefined as never })).toThrow(OutboxError);
    expect(() => transactionKysely({ queue: "plain", transaction: undefined as never })).toThrow(
      'transactionKysely: queue "plain" does not run its handler in a transaction',
    );
  });

  it("a closed LocalQueue refuses a push with an OutboxError", () => {
    const queue = new LocalQueue<number>(2);
    queue.close();
    expect(() => queue.push([1])).toThrow(OutboxError);
  });

  it("a time bound rejects with an OutboxError", async () => {
    const error = await timeBound(new Promise(() => {}), 0, "probe").catch((e: unknown) => e);
    expect(error).toBeInstanceOf(OutboxError);
    expect((error as Error).message).toBe("probe timed out after 0 ms");
  });
});
