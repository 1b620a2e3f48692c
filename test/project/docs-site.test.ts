import { spawn } from "node:child_process";
import { existsSync } from "node:fs";
import path from "node:path";
import { describe, expect, it } from "vitest";
import { docPages, ROOT, readDoc } from "../support/docs.js";
import { testTempDir } from "../support/temp-dir.js";

// The docs site as `npm run docs:build` makes it: VitePress fails the build on a link to a page that does
// not exist, docs/.vitepress/built-links.ts on a #fragment or a nav/sidebar entry that leads nowhere, and
// docs/.vitepress/repo-links.ts on a link to a repository file that is not there. The README stays short
// and points into docs/.

/** Runs `vitepress build docs` into a folder of its own; resolves with its exit code and all its output. */
function buildSite(dir: string): Promise<{ code: number | null; output: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(
      process.execPath,
      [path.join(ROOT, "node_modules/vitepress/bin/vitepress.js"), "build", "docs", "--outDir", dir],
      { cwd: ROOT, env: { ...process.env, NO_COLOR: "1" }, stdio: ["ignore", "pipe", "pipe"] },
    );
    let output = "";
    child.stdout.on("data", (chunk: Buffer) => {
      output += chunk.toString();
    });
    child.stderr.on("data", (chunk: Buffer) => {
      output += chunk.toString();
    });
    child.on("error", reject);
    child.on("close", (code) => resolve({ code, output }));
  });
}

describe("the docs site", () => {
  // The build takes about a minute on an idle 2-core machine; the timeout only catches a hang.
  it("builds, with no dead internal link", { timeout: 900_000 }, async () => {
    const outDir = await testTempDir("outbox-docs-site-");
    const { code, output } = await buildSite(outDir);
    expect(code, `vitepress build failed:\n${output}`).toBe(0);
    // A page of each audience, and the generated API reference, are part of the site.
    for (const page of [
      "index.html",
      "guide/publishing.html",
      "operate/relays/http.html",
      "reference/configuration.html",
      "api/README.html",
      "contributing/layout.html",
    ]) {
      expect(existsSync(path.join(outDir, page)), page).toBe(true);
    }
  });
});

describe("the README", () => {
  const readme = readDoc("README.md");

  it("holds at most 300 lines", () => {
    // Counted as `wc -l` counts: line ends.
    expect(readme.match(/\n/g)?.length ?? 0).toBeLessThanOrEqual(300);
  });

  it("links only to files that exist", () => {
    const links = [...readme.matchAll(/\]\(([^)]+)\)/g)].map((m) => m[1] ?? "");
    const local = links.filter((href) => !/^[a-z][a-z0-9+.-]*:/i.test(href) && !href.startsWith("#"));
    expect(local.length).toBeGreaterThan(10);
    for (const href of local) {
      expect(existsSync(path.join(ROOT, href.replace(/[?#].*$/, ""))), href).toBe(true);
    }
  });
});

describe("the docs sidebar", () => {
  it("lists every hand-written page of docs/ (no page only a search finds)", async () => {
    const { default: config } = await import("../../docs/.vitepress/config.mjs");
    const linked = new Set<string>();
    const collect = (items: readonly { link?: string; items?: unknown[] }[]): void => {
      for (const item of items) {
        if (item.link !== undefined) linked.add(item.link.endsWith("/") ? `${item.link}index` : item.link);
        if (item.items !== undefined) collect(item.items as { link?: string; items?: unknown[] }[]);
      }
    };
    const sidebar = config.themeConfig?.sidebar as Record<string, { link?: string; items?: unknown[] }[]>;
    for (const items of Object.values(sidebar)) collect(items);
    const pages = docPages()
      .filter((page) => page !== "docs/index.md")
      .map((page) => page.replace(/^docs/, "").replace(/\.md$/, ""));
    expect(pages.filter((page) => !linked.has(page))).toEqual([]);
  });
});
