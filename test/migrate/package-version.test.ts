import { describe, expect, it } from "vitest";
import { compareVersions } from "../../src/migrate/package-version.js";

/** Which release's function bodies win (apply-functions) rests on this order: SemVer precedence. */
describe("compareVersions", () => {
  it("orders pre-releases before their release, by SemVer precedence", () => {
    const ordered = [
      "not a version",
      "0.1.0",
      "0.2.0-alpha",
      "0.2.0-alpha.1",
      "0.2.0-alpha.beta",
      "0.2.0-beta.2",
      "0.2.0-beta.11",
      "0.2.0-rc.1",
      "0.2.0",
      "0.2.1",
      "0.10.0",
      "1.0.0",
    ];
    for (let i = 0; i < ordered.length; i++) {
      for (let j = 0; j < ordered.length; j++) {
        const [a, b] = [ordered[i] ?? "", ordered[j] ?? ""];
        expect(Math.sign(compareVersions(a, b)), `${a} vs ${b}`).toBe(Math.sign(i - j));
      }
    }
  });

  it("counts builds of one version as that version: build metadata is not a version", () => {
    expect(compareVersions("0.2.0+build.1", "0.2.0+build.2")).toBe(0);
    expect(compareVersions("0.2.0-rc.1+x", "0.2.0-rc.1")).toBe(0);
    expect(compareVersions("0.2.0+x", "0.2.0-rc.1")).toBeGreaterThan(0);
  });
});
