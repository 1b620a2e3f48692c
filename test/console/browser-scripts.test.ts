import { readFileSync } from "node:fs";
import { describe, expect, it } from "vitest";
import { CONSOLE_SCRIPT, RELAYS_SCRIPT } from "../../src/console/browser-scripts.js";

/**
 * The console's browser scripts reach the page two ways: compiled by `npm run build` into dist/ (the
 * package, the CLI tests), transpiled at startup when run from src/ (tsx, these tests). Both must serve the
 * same bytes. dist/ is built by the global setup.
 */
describe("the console's browser scripts", () => {
  it("are the same transpiled from src/ as compiled into dist/", () => {
    expect(CONSOLE_SCRIPT).toBe(readFileSync("dist/console/browser/console.js", "utf8"));
    expect(RELAYS_SCRIPT).toBe(readFileSync("dist/console/browser/relays.js", "utf8"));
  });

  it("are plain scripts: no module syntax, no type left", () => {
    for (const script of [CONSOLE_SCRIPT, RELAYS_SCRIPT]) {
      expect(script.startsWith('"use strict";')).toBe(true);
      expect(script).not.toMatch(/^\s*(import|export)\b/m);
      expect(script).not.toMatch(/\binterface \w+/);
    }
  });
});
