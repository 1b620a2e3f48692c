import { execFile } from "node:child_process";
import { readdir, readFile } from "node:fs/promises";
import path from "node:path";
import { promisify } from "node:util";
import { describe, expect, it } from "vitest";
import { testTempDir } from "../support/temp-dir.js";

const COMMITTED = path.resolve("docs/api");
const REGENERATE = "the API reference in docs/api/ is stale: regenerate it with `npm run -s docs:api`";

async function files(dir: string, prefix = ""): Promise<string[]> {
  const out: string[] = [];
  for (const entry of await readdir(dir, { withFileTypes: true })) {
    const rel = path.posix.join(prefix, entry.name);
    if (entry.isDirectory()) out.push(...(await files(path.join(dir, entry.name), rel)));
    else out.push(rel);
  }
  return out.sort();
}

/** typedoc as `npm run docs:api` runs it (same typedoc.json), into `out` instead of docs/api/. */
async function generate(out: string): Promise<{ code: number; output: string }> {
  const bin = path.resolve("node_modules/typedoc/bin/typedoc");
  try {
    const { stdout, stderr } = await promisify(execFile)(process.execPath, [bin, "--out", out], {
      env: { ...process.env, NO_COLOR: "1", FORCE_COLOR: "0" },
      maxBuffer: 16 * 1024 * 1024,
    });
    return { code: 0, output: stdout + stderr };
  } catch (error) {
    const e = error as { code?: number; stdout?: string; stderr?: string };
    return { code: typeof e.code === "number" ? e.code : 1, output: `${e.stdout ?? ""}${e.stderr ?? ""}` };
  }
}

describe("API reference (docs/api/, generated from the TSDoc by typedoc)", () => {
  it("documents every export of src/index.ts and matches the committed reference byte for byte", {
    timeout: 180_000,
  }, async () => {
    const out = await testTempDir("outbox-api-docs-");
    const { code, output } = await generate(out);

    // (a) typedoc.json turns every warning (an export without TSDoc, a broken {@link}, a type that leaks
    // from an unexported module) into a failure.
    const problems = output.split("\n").filter((line) => /\[(warning|error)\]/.test(line));
    expect(problems, `typedoc reported problems:\n${output}`).toEqual([]);
    expect(code, `typedoc failed:\n${output}`).toBe(0);

    // (b) The committed reference is exactly what the TSDoc produces.
    const generated = await files(out);
    const committed = await files(COMMITTED).catch(() => []);
    expect(committed, `${REGENERATE} (files differ)`).toEqual(generated);
    for (const file of generated) {
      const [fresh, stored] = await Promise.all([
        readFile(path.join(out, file)),
        readFile(path.join(COMMITTED, file)),
      ]);
      expect(stored.equals(fresh), `${REGENERATE} (docs/api/${file} differs)`).toBe(true);
    }

    // (c) The exports the issue names each have their entry in the main entry's index (one module per
    // package entry point: index for "pg-outbox-worker", testing for "pg-outbox-worker/testing").
    const modules = await readFile(path.join(out, "README.md"), "utf8");
    expect(modules).toMatch(/\[testing\]\(testing\/README\.md\)/);
    const index = await readFile(path.join(out, "index", "README.md"), "utf8");
    for (const name of [
      "queueStatus",
      "peekMessages",
      "listDeadLetters",
      "getDeadLetter",
      "replayDeadLetters",
      "purgeDeadLetters",
      "createRelay",
      "migrationState",
      "StopResult",
    ]) {
      expect(index, `${name} missing from the API reference`).toMatch(new RegExp(`\\[${name}\\]\\(`));
    }
  });
});
