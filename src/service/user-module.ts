/**
 * Loads an operator's module (a config file or a handlers module), TypeScript included. Node 20 cannot
 * import a `.ts` file by itself; the installed CLI then uses the `tsx` loader of the operator's project
 * (or one installed beside this package), registered on first need. Without it the error says what to do.
 */
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import path from "node:path";
import { pathToFileURL } from "node:url";
import { OutboxError } from "../contract/errors.js";

const TYPESCRIPT = /\.[cm]?tsx?$/;

let typescriptLoader: Promise<void> | undefined;

/**
 * tsx's two register APIs (its ES module hooks, and its CommonJS hooks for a `.ts` file outside a
 * `"type": "module"` package), from the operator's project first, then beside this package. Resolved
 * through tsx's package.json: require.resolve would pick the CommonJS builds of the APIs themselves.
 */
function findTsxApis(): string[] | undefined {
  for (const base of [path.join(process.cwd(), "noop.js"), import.meta.url]) {
    try {
      const manifest = createRequire(base).resolve("tsx/package.json");
      const pkg = JSON.parse(readFileSync(manifest, "utf8")) as {
        exports?: Record<string, { import?: { default?: string } } | string>;
      };
      const entries = ["./esm/api", "./cjs/api"].map((name) => {
        const entry = pkg.exports?.[name];
        const file = typeof entry === "object" ? entry.import?.default : undefined;
        if (!file) throw new OutboxError(`tsx has no ${name}`);
        return path.join(path.dirname(manifest), file);
      });
      return entries;
    } catch {
      // not installed there (or too old a tsx)
    }
  }
  return undefined;
}

function registerTypescript(file: string): Promise<void> {
  typescriptLoader ??= (async () => {
    const apis = findTsxApis();
    if (apis === undefined) {
      throw new OutboxError(
        `${file} is TypeScript, which Node ${process.version} cannot load by itself: install tsx (4 or later) in your project (npm install --save-dev tsx) and it is used automatically, or compile the file to JavaScript`,
      );
    }
    for (const api of apis) {
      const { register } = (await import(pathToFileURL(api).href)) as { register: () => unknown };
      register();
    }
  })();
  return typescriptLoader;
}

function isUnknownExtension(error: unknown): boolean {
  return (error as { code?: unknown } | null)?.code === "ERR_UNKNOWN_FILE_EXTENSION";
}

/** `import()` of a file path; a TypeScript file gets the tsx loader when Node cannot load it as it is. */
export async function importUserModule(file: string): Promise<Record<string, unknown>> {
  const url = pathToFileURL(path.resolve(file)).href;
  let loaded: Record<string, unknown>;
  try {
    loaded = (await import(url)) as Record<string, unknown>;
  } catch (error) {
    // Under tsx already (npm run outbox-worker, the tests) the first import works; only then is it needed.
    if (!TYPESCRIPT.test(file) || !isUnknownExtension(error)) throw error;
    await registerTypescript(file);
    // A fresh URL: the module map keeps the failed import of the plain one.
    loaded = (await import(`${url}?typescript`)) as Record<string, unknown>;
  }
  return TYPESCRIPT.test(file) ? unwrapCommonJs(loaded) : loaded;
}

/**
 * A .ts file outside a `"type": "module"` package is compiled to CommonJS: its exports arrive wrapped once
 * more in `default` (module.exports, marked __esModule). Unwrapped, it reads like the ES module it was written as.
 */
function unwrapCommonJs(loaded: Record<string, unknown>): Record<string, unknown> {
  const inner = loaded.default as { __esModule?: unknown } | null | undefined;
  return inner !== null && typeof inner === "object" && inner.__esModule === true
    ? (inner as Record<string, unknown>)
    : loaded;
}
