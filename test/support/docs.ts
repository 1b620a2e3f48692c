import { readdirSync, readFileSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

/** The repository's root folder. */
export const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");

/** A Markdown file of the repository (`README.md`, `docs/guide/topics.md`…), as text. */
export function readDoc(file: string): string {
  return readFileSync(path.join(ROOT, file), "utf8");
}

/** Every hand-written page of the docs site (docs/**.md without the generated docs/api), repository-relative. */
export function docPages(): string[] {
  const pages: string[] = [];
  const walk = (dir: string): void => {
    for (const entry of readdirSync(path.join(ROOT, dir), { withFileTypes: true })) {
      const rel = `${dir}/${entry.name}`;
      if (entry.isDirectory() && !["docs/api", "docs/.vitepress"].includes(rel)) walk(rel);
      else if (entry.isFile() && entry.name.endsWith(".md")) pages.push(rel);
    }
  };
  walk("docs");
  return pages.sort();
}

/**
 * The section of `file` under the heading line `heading` (e.g. `"## Installing"`), up to the next heading
 * of the same or a higher level; lines inside code blocks are never headings. Throws when the file has no
 * such heading, so a test reading a moved or renamed section fails saying which.
 */
export function docSection(file: string, heading: string): string {
  const level = /^#+/.exec(heading)?.[0].length;
  if (level === undefined) throw new Error(`not a heading: ${heading}`);
  const lines = readDoc(file).split("\n");
  let fence: string | undefined;
  let start: number | undefined;
  for (const [i, line] of lines.entries()) {
    const marker = /^\s*(`{3,}|~{3,})/.exec(line)?.[1];
    if (marker !== undefined) {
      if (fence === undefined) fence = marker;
      else if (marker.startsWith(fence) && line.trim() === marker) fence = undefined;
      continue;
    }
    if (fence !== undefined) continue;
    if (start === undefined) {
      if (line.trim() === heading) start = i + 1;
      continue;
    }
    const h = /^(#+) /.exec(line)?.[1];
    if (h !== undefined && h.length <= level) return lines.slice(start, i).join("\n");
  }
  if (start === undefined) throw new Error(`no "${heading}" heading in ${file}`);
  return lines.slice(start).join("\n");
}
