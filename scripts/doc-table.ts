import { readFileSync, writeFileSync } from "node:fs";

/**
 * Prints a generated Markdown table, or with `--write` pastes it into `page` between the
 * `<!-- name:start -->` and `<!-- name:end -->` markers (`npx biome format --write` pads it afterwards).
 */
export function printOrPaste(table: string, page: string, name: string, argv = process.argv.slice(2)): void {
  if (!argv.includes("--write")) {
    console.log(table);
    return;
  }
  const start = `<!-- ${name}:start -->`;
  const end = `<!-- ${name}:end -->`;
  const text = readFileSync(page, "utf8");
  const from = text.indexOf(start);
  const to = text.indexOf(end);
  if (from < 0 || to < from) throw new Error(`${page} has no ${start} … ${end} markers`);
  writeFileSync(page, `${text.slice(0, from + start.length)}\n${table.trim()}\n${text.slice(to)}`);
  console.log(`${page}: table written between ${start} and ${end}`);
}
