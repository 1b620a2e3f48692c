import { readdirSync, readFileSync } from "node:fs";
import path from "node:path";
import { describe, expect, it } from "vitest";

/**
 * Which folder of src/ may import which: docs/contributing/layout.md says the same. Vocabulary sits at the
 * bottom (util, contract), then the SQL and the lease store, then the engine's rooms, then what wires them
 * (worker), then what uses the worker (relay, inspect, service, cli). No arrow runs back up.
 */
/** The service sits on everything but the CLI; the CLI on everything. */
const SERVICE_IMPORTS = [
  "console",
  "worker",
  "relay",
  "inspect",
  "migrate",
  "notify",
  "produce",
  "subscribe",
  "embedded",
  "retry",
  "sql",
  "contract",
  "util",
];

const ALLOWED: Record<string, readonly string[]> = {
  util: [],
  // Wire formats both ends share: the relays encode and sign, the consumer inbox decodes and verifies.
  wire: [],
  contract: ["util"],
  sql: ["contract", "util"],
  lease: ["sql", "contract", "util"],
  retry: ["contract"],
  notify: ["sql", "contract", "util"],
  produce: ["sql", "contract", "util"],
  subscribe: ["sql", "contract", "util"],
  migrate: ["sql", "contract", "util"],
  embedded: ["sql", "contract", "util"],
  fetch: ["retry", "contract"],
  complete: ["lease", "retry", "contract"],
  dispatch: ["lease", "retry", "contract", "util"],
  worker: ["fetch", "dispatch", "complete", "lease", "notify", "produce", "retry", "sql", "contract", "util"],
  relay: ["wire", "contract", "util"],
  // The consumer inbox runs in the receiving service: no engine, no broker client, no logger.
  inbox: ["wire", "contract", "util"],
  inspect: ["sql", "migrate", "contract", "util"],
  console: ["inspect", "subscribe", "worker", "sql", "contract", "util"],
  describe: ["relay", "contract", "util"],
  testing: ["worker", "dispatch", "contract"],
  service: SERVICE_IMPORTS,
  cli: ["service", "describe", ...SERVICE_IMPORTS],
};

function sources(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((entry) => {
    const full = path.join(dir, entry.name);
    if (entry.isDirectory()) return sources(full);
    return entry.name.endsWith(".ts") ? [full] : [];
  });
}

/** Every (folder → folder) arrow of src/, static and dynamic imports and re-exports alike. */
function arrows(): { from: string; to: string; file: string }[] {
  const found: { from: string; to: string; file: string }[] = [];
  for (const file of sources("src")) {
    const from = path.relative("src", path.dirname(file)).split(path.sep)[0] || "(root)";
    const text = readFileSync(file, "utf8");
    for (const match of text.matchAll(/(?:from\s+|import\s*\(\s*)"(\.{1,2}\/[^"]+)"/g)) {
      const target = path.relative("src", path.resolve(path.dirname(file), match[1] ?? ""));
      const to = target.includes(path.sep) ? (target.split(path.sep)[0] ?? "") : "(root)";
      if (to !== from) found.push({ from, to, file });
    }
  }
  return found;
}

describe("layers", () => {
  it("every folder imports only the folders below it", () => {
    const wrong = arrows()
      .filter((a) => a.from !== "(root)" && !(ALLOWED[a.from] ?? []).includes(a.to))
      .map((a) => `${a.file}: ${a.from} → ${a.to}`);
    expect(wrong).toEqual([]);
  });

  it("every folder of src/ has its place, and the allowed arrows form no cycle", () => {
    const folders = readdirSync("src", { withFileTypes: true })
      .filter((e) => e.isDirectory())
      .map((e) => e.name)
      .sort();
    expect(folders).toEqual(Object.keys(ALLOWED).sort());
    const visiting = new Set<string>();
    const done = new Set<string>();
    const visit = (folder: string, trail: string[]): void => {
      if (done.has(folder)) return;
      if (visiting.has(folder)) throw new Error(`cycle: ${[...trail, folder].join(" → ")}`);
      visiting.add(folder);
      for (const below of ALLOWED[folder] ?? []) visit(below, [...trail, folder]);
      visiting.delete(folder);
      done.add(folder);
    };
    for (const folder of folders) visit(folder, []);
  });

  it("src/ files outside the root only import inside src/ through relative paths to existing folders", () => {
    // Not vacuous: the scan sees the engine's arrows.
    const seen = arrows();
    expect(seen.some((a) => a.from === "worker" && a.to === "lease")).toBe(true);
    expect(seen.some((a) => a.from === "complete" && a.to === "lease")).toBe(true);
  });

  it("nothing under scripts/ imports from test/ (what both need lives in scripts/support/)", () => {
    const intoTest: string[] = [];
    let imports = 0;
    for (const file of sources("scripts")) {
      const text = readFileSync(file, "utf8");
      for (const match of text.matchAll(/(?:from\s+|import\s*\(\s*)"(\.{1,2}\/[^"]+)"/g)) {
        imports++;
        const target = path.relative(".", path.resolve(path.dirname(file), match[1] ?? ""));
        if (target.split(path.sep)[0] === "test") intoTest.push(`${file}: ${match[1]}`);
      }
    }
    // Not vacuous: the scripts do import relative paths (src/, scripts/support/).
    expect(imports).toBeGreaterThan(0);
    expect(intoTest).toEqual([]);
  });
});
