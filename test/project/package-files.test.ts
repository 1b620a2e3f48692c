import { execFile } from "node:child_process";
import { existsSync } from "node:fs";
import { readdir, readFile } from "node:fs/promises";
import { promisify } from "node:util";
import { describe, expect, it } from "vitest";
import { docPages, readDoc } from "../support/docs.js";

const exec = promisify(execFile);

describe("what the package ships", () => {
  it("holds every examples/ file the README and the docs point at, each existing, and none of docs/", async () => {
    // --ignore-scripts: the file list without running prepack's build (package.test.ts builds dist).
    const { stdout } = await exec("npm", ["pack", "--dry-run", "--ignore-scripts", "--json"], {
      timeout: 60_000,
    });
    const packed = new Set(
      (JSON.parse(stdout) as { files: { path: string }[] }[])[0]?.files.map((f) => f.path) ?? [],
    );
    const text = ["README.md", ...docPages()].map(readDoc).join("\n");
    const mentioned = [...new Set(text.match(/examples\/[\w./-]+\.\w+/g) ?? [])];
    expect(mentioned.length).toBeGreaterThan(0);
    for (const file of mentioned) {
      expect(existsSync(file), `${file} exists`).toBe(true);
      // The consumer examples run from a checkout (tsx, generated types, the repository's sources): the
      // docs say so, and shipping them would hand users imports of src/ that do not exist.
      const repositoryOnly = file.startsWith("examples/consumers/");
      expect(packed.has(file), `${file} is ${repositoryOnly ? "not " : ""}in the package`).toBe(
        !repositoryOnly,
      );
    }
    expect(packed.has("LICENSE")).toBe(true);
    // The docs site (its pages, config, build output) is for the repository, not for an install.
    expect([...packed].filter((f) => f.startsWith("docs/"))).toEqual([]);
    expect([...packed].filter((f) => f.startsWith("migrations/")).length).toBeGreaterThan(0);
    // The function files: migrate applies them after the numbered migrations, from the installed package.
    const functionFiles = (await readdir("migrations/functions")).filter((f) => f.endsWith(".sql"));
    expect(functionFiles.length).toBeGreaterThan(0);
    for (const file of functionFiles) {
      expect(
        packed.has(`migrations/functions/${file}`),
        `migrations/functions/${file} is in the package`,
      ).toBe(true);
    }
  });

  it("holds every file package.json's exports point at (the main entry and pg-outbox-worker/testing)", async () => {
    const { stdout } = await exec("npm", ["pack", "--dry-run", "--ignore-scripts", "--json"], {
      timeout: 60_000,
    });
    const packed = new Set(
      (JSON.parse(stdout) as { files: { path: string }[] }[])[0]?.files.map((f) => f.path) ?? [],
    );
    const { exports } = JSON.parse(await readFile("package.json", "utf8")) as {
      exports: Record<string, unknown>;
    };
    expect(Object.keys(exports)).toEqual(expect.arrayContaining([".", "./testing"]));
    // Every condition's target, nested or not: a types path missing from dist/ breaks only type checking.
    const targets = (value: unknown): string[] =>
      typeof value === "string" ? [value] : Object.values(value as object).flatMap(targets);
    for (const [subpath, conditions] of Object.entries(exports)) {
      for (const target of targets(conditions)) {
        expect(packed.has(target.replace(/^\.\//, "")), `${subpath} → ${target} is in the package`).toBe(
          true,
        );
        // …built from a source that exists: a stale file left in dist/ must not pass for an entry.
        const source = target.match(/^\.\/dist\/(.+?)(?:\.d\.ts|\.js)$/)?.[1];
        if (source) expect(existsSync(`src/${source}.ts`), `${target}'s source`).toBe(true);
      }
    }
  });

  it("ships no test-only code: the in-memory lease store stays in test/support/", async () => {
    const { stdout } = await exec("npm", ["pack", "--dry-run", "--ignore-scripts", "--json"], {
      timeout: 60_000,
    });
    const packed = (JSON.parse(stdout) as { files: { path: string }[] }[])[0]?.files.map((f) => f.path) ?? [];
    expect(packed.some((f) => f.startsWith("dist/lease/"))).toBe(true);
    expect(packed.filter((f) => /memory-store/.test(f))).toEqual([]);
  });

  it("ships the console's browser scripts compiled, not their TypeScript", async () => {
    const { stdout } = await exec("npm", ["pack", "--dry-run", "--ignore-scripts", "--json"], {
      timeout: 60_000,
    });
    const packed = (JSON.parse(stdout) as { files: { path: string }[] }[])[0]?.files.map((f) => f.path) ?? [];
    const browser = packed.filter((f) => f.startsWith("dist/console/browser/")).sort();
    expect(browser).toEqual(["dist/console/browser/console.js", "dist/console/browser/relays.js"]);
  });
});
