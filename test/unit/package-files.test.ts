import { execFile } from "node:child_process";
import { existsSync } from "node:fs";
import { readFile } from "node:fs/promises";
import { promisify } from "node:util";
import { describe, expect, it } from "vitest";

const exec = promisify(execFile);

describe("what the package ships", () => {
  it("holds every examples/ file the README points at, and each exists", async () => {
    // --ignore-scripts: the file list without running prepack's build (package.test.ts builds dist).
    const { stdout } = await exec("npm", ["pack", "--dry-run", "--ignore-scripts", "--json"], {
      timeout: 60_000,
    });
    const packed = new Set(
      (JSON.parse(stdout) as { files: { path: string }[] }[])[0]?.files.map((f) => f.path) ?? [],
    );
    const readme = await readFile("README.md", "utf8");
    const mentioned = [...new Set(readme.match(/examples\/[\w./-]+\.\w+/g) ?? [])];
    expect(mentioned.length).toBeGreaterThan(0);
    for (const file of mentioned) {
      expect(existsSync(file), `${file} exists`).toBe(true);
      expect(packed.has(file), `${file} is in the package`).toBe(true);
    }
    expect(packed.has("LICENSE")).toBe(true);
    expect([...packed].filter((f) => f.startsWith("migrations/")).length).toBeGreaterThan(0);
  });
});
