import { existsSync, readFileSync } from "node:fs";
import { createRequire } from "node:module";
import type * as TypeScript from "typescript";

/**
 * A browser script of ./browser/ as the page gets it. `npm run build` compiles them beside this file in
 * dist/; run from the sources (tsx, vitest) there is no .js, so the .ts is transpiled here, once, with the
 * devDependency typescript (which only a checkout has: the package ships the compiled file).
 */
function browserScript(name: string): string {
  const compiled = new URL(`./browser/${name}.js`, import.meta.url);
  if (existsSync(compiled)) return readFileSync(compiled, "utf8");
  const ts = createRequire(import.meta.url)("typescript") as typeof TypeScript;
  const source = readFileSync(new URL(`./browser/${name}.ts`, import.meta.url), "utf8");
  return ts.transpileModule(source, {
    compilerOptions: { target: ts.ScriptTarget.ES2017, module: ts.ModuleKind.None, alwaysStrict: true },
  }).outputText;
}

export const CONSOLE_SCRIPT = browserScript("console");
export const RELAYS_SCRIPT = browserScript("relays");
