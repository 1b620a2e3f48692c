import { readdirSync, readFileSync } from "node:fs";
import path from "node:path";

/**
 * Every internal link of the built site that leads nowhere: a page that was not built, or a `#fragment`
 * that no element of its page has as id. VitePress checks that a Markdown link's page exists, but not
 * its fragment, nor the nav and sidebar; a section moved to another page would otherwise break silently.
 */
export function deadBuiltLinks(outDir: string): string[] {
  const pages = new Map<string, string>();
  const walk = (dir: string): void => {
    for (const entry of readdirSync(dir, { withFileTypes: true })) {
      const full = path.join(dir, entry.name);
      if (entry.isDirectory()) walk(full);
      else if (entry.name.endsWith(".html")) pages.set(toUrl(outDir, full), readFileSync(full, "utf8"));
    }
  };
  walk(outDir);
  const ids = new Map<string, Set<string>>();
  const idsOf = (url: string): Set<string> => {
    let set = ids.get(url);
    if (set === undefined) {
      set = new Set([...(pages.get(url) ?? "").matchAll(/\sid="([^"]*)"/g)].map((m) => decode(m[1] ?? "")));
      ids.set(url, set);
    }
    return set;
  };
  const dead = new Set<string>();
  for (const [url, html] of pages) {
    for (const match of html.matchAll(/<a\s[^>]*?href="([^"]*)"/g)) {
      const href = decode(match[1] ?? "");
      if (/^[a-z][a-z0-9+.-]*:|^\/\//i.test(href) || href === "" || href === "#") continue;
      const target = new URL(href, `http://site${url}`);
      const page = target.pathname.endsWith("/") ? `${target.pathname}index.html` : target.pathname;
      if (!page.endsWith(".html")) continue;
      if (!pages.has(page)) dead.add(`${url}: ${href} (no such page)`);
      else if (target.hash.length > 1 && !idsOf(page).has(decodeURIComponent(target.hash.slice(1)))) {
        dead.add(`${url}: ${href} (no ${target.hash} on ${page})`);
      }
    }
  }
  return [...dead].sort();
}

function toUrl(outDir: string, file: string): string {
  return `/${path.relative(outDir, file).split(path.sep).join("/")}`;
}

function decode(text: string): string {
  return text
    .replaceAll("&amp;", "&")
    .replaceAll("&quot;", '"')
    .replaceAll("&#39;", "'")
    .replaceAll("&lt;", "<")
    .replaceAll("&gt;", ">");
}
