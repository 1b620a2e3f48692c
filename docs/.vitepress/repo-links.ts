import { existsSync } from "node:fs";
import path from "node:path";
import type { MarkdownRenderer } from "vitepress";

type Token = ReturnType<MarkdownRenderer["parse"]>[number];
type TokenConstructor = new (type: string, tag: string, nesting: -1 | 0 | 1) => Token;

/**
 * Links from a page to a file of the repository outside docs/ (bench/RESULTS.md, examples/…) are written
 * as relative paths, so they work where the Markdown is read on a forge. The site has no page for them:
 * VitePress would report them as dead, so they are shown as the file's path instead of a link. A path to
 * a file that does not exist fails the build, as a dead link does.
 */
export function repoLinks(docsRoot: string): (md: MarkdownRenderer) => void {
  const repoRoot = path.dirname(docsRoot);
  return (md) => {
    md.core.ruler.push("repo_links", (state) => {
      const page = (state.env as { path?: string }).path;
      if (page === undefined) return;
      for (const block of state.tokens) {
        if (block.type === "inline" && block.children)
          block.children = rewrite(block.children, page, state.Token);
      }
    });

    function rewrite(tokens: Token[], page: string, TokenClass: TokenConstructor): Token[] {
      const out: Token[] = [];
      const html = (content: string): Token => {
        const token = new TokenClass("html_inline", "", 0);
        token.content = content;
        return token;
      };
      let open: { file: string; text: string } | undefined;
      for (const token of tokens) {
        if (token.type === "link_open") {
          const href = token.attrGet("href") ?? "";
          const target = outsideDocs(href, page);
          if (target !== undefined) {
            open = { file: target, text: "" };
            out.push(html(`<span class="repo-file" title="${target} in the repository">`));
            continue;
          }
        }
        if (open !== undefined && token.type === "link_close") {
          if (open.text !== open.file) out.push(html(` (<code>${md.utils.escapeHtml(open.file)}</code>)`));
          out.push(html("</span>"));
          open = undefined;
          continue;
        }
        if (open !== undefined && (token.type === "text" || token.type === "code_inline"))
          open.text += token.content;
        out.push(token);
      }
      return out;
    }

    /** The repository path `href` points at when it leaves docs/, checked to exist; else undefined. */
    function outsideDocs(href: string, page: string): string | undefined {
      if (/^[a-z][a-z0-9+.-]*:|^\/|^#/i.test(href)) return undefined;
      const file = path.resolve(path.dirname(page), decodeURIComponent(href.replace(/[?#].*$/, "")));
      if (file === docsRoot || file.startsWith(docsRoot + path.sep)) return undefined;
      const relative = path.relative(repoRoot, file).split(path.sep).join("/");
      if (relative.startsWith("..") || !existsSync(file)) {
        throw new Error(
          `${path.relative(repoRoot, page)}: link to ${href}, which is no file of the repository`,
        );
      }
      return relative;
    }
  };
}
