import { execFile } from "node:child_process";
import { readFileSync } from "node:fs";
import { mkdir, mkdtemp, readdir, rm, symlink, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";

/**
 * The package's types as a TypeScript consumer compiles them: `strict`, no `skipLibCheck`, against a copy
 * unpacked from `npm pack` (dist/ is built by the global setup) into an app whose node_modules holds what
 * an install would put there: the package's `dependencies`, and the consumer's own `@types/node`. Our
 * .d.ts files import `pg` types: without `@types/pg` among the dependencies that fails with TS7016.
 */

const exec = promisify(execFile);

/** Runs a command; its exit code and output, never a throw. */
function run(file: string, args: string[], cwd: string): Promise<{ code: number; text: string }> {
  return exec(file, args, { cwd, timeout: 120_000 }).then(
    (r) => ({ code: 0, text: r.stdout + r.stderr }),
    (e: { code: number; stdout: string; stderr: string }) => ({ code: e.code, text: e.stdout + e.stderr }),
  );
}
const ROOT = path.resolve(".");
const manifest = JSON.parse(readFileSync(path.join(ROOT, "package.json"), "utf8")) as {
  dependencies: Record<string, string>;
};
let app: string;
let tarball: string;

async function link(name: string): Promise<void> {
  const to = path.join(app, "node_modules", name);
  await mkdir(path.dirname(to), { recursive: true });
  await symlink(path.join(ROOT, "node_modules", name), to, "dir");
}

beforeAll(async () => {
  app = await mkdtemp(path.join(tmpdir(), "outbox-types-"));
  const packed = path.join(app, "packed");
  await mkdir(packed);
  // dist/ is already built: no prepack build again.
  await exec("npm", ["pack", "--ignore-scripts", "--pack-destination", packed], {
    cwd: ROOT,
    timeout: 120_000,
  });
  tarball = path.join(packed, (await readdir(packed))[0] ?? "");
  const copy = path.join(app, "node_modules", "pg-outbox-worker");
  await mkdir(copy, { recursive: true });
  await exec("tar", ["-xzf", tarball, "-C", copy, "--strip-components=1"]);
  // What `npm install pg-outbox-worker` hoists beside it; their own dependencies resolve from their real
  // paths, as installed ones would from the same folder.
  for (const name of Object.keys(manifest.dependencies)) await link(name);
  await link("@types/node");
}, 180_000);

afterAll(async () => {
  if (app) await rm(app, { recursive: true, force: true });
});

describe("the package's types", () => {
  it("compile in a strict consumer without skipLibCheck (every type it imports is a dependency)", async () => {
    await writeFile(path.join(app, "package.json"), JSON.stringify({ type: "module" }));
    await writeFile(
      path.join(app, "tsconfig.json"),
      JSON.stringify({
        compilerOptions: {
          strict: true,
          skipLibCheck: false,
          noEmit: true,
          module: "nodenext",
          moduleResolution: "nodenext",
          target: "es2022",
          types: ["node"],
        },
        files: ["consumer.ts"],
      }),
    );
    await writeFile(
      path.join(app, "consumer.ts"),
      `import { createPublisher, createWorker, defineQueue, migrate, type Worker } from "pg-outbox-worker";
import { createInbox } from "pg-outbox-worker/inbox";
import { testHandler } from "pg-outbox-worker/testing";

export const queue = defineQueue("orders.placed");
export const publisher = createPublisher();
export const worker: Worker = createWorker({ connection: "postgres://localhost/app", queues: {} });
export const steps = [migrate, createInbox, testHandler];
`,
    );
    const tsc = path.join(ROOT, "node_modules", "typescript", "bin", "tsc");
    const out = await run(process.execPath, [tsc, "-p", app], app);
    expect(out.text).toBe("");
    expect(out.code).toBe(0);
  }, 180_000);

  it("are clean for @arethetypeswrong/cli, but for require(esm), which Node 20.19+ and TypeScript 5.8+ allow", async () => {
    // The one ignored rule: attw's node16 model says require() of an ES module fails; Node >= 20.19 (our
    // engines) loads it, and TypeScript's `module: nodenext` types it (the next two tests prove both).
    const attw = path.join(ROOT, "node_modules", "@arethetypeswrong", "cli", "dist", "index.js");
    const out = await run(process.execPath, [attw, tarball, "--ignore-rules", "cjs-resolves-to-esm"], app);
    expect(out.code, out.text).toBe(0);
  }, 180_000);

  it("type-check in a CommonJS consumer under module nodenext (require of the ES module)", async () => {
    await writeFile(
      path.join(app, "tsconfig.cjs.json"),
      JSON.stringify({
        compilerOptions: {
          strict: true,
          skipLibCheck: false,
          noEmit: true,
          module: "nodenext",
          moduleResolution: "nodenext",
          target: "es2022",
          types: ["node"],
        },
        files: ["consumer.cts"],
      }),
    );
    await writeFile(
      path.join(app, "consumer.cts"),
      `import { createWorker, type Worker } from "pg-outbox-worker";
import { createInbox } from "pg-outbox-worker/inbox";
import { testHandler } from "pg-outbox-worker/testing";

export const worker: Worker = createWorker({ connection: "postgres://localhost/app", queues: {} });
export const steps = [createInbox, testHandler];
`,
    );
    const tsc = path.join(ROOT, "node_modules", "typescript", "bin", "tsc");
    const out = await run(process.execPath, [tsc, "-p", path.join(app, "tsconfig.cjs.json")], app);
    expect(out.text).toBe("");
    expect(out.code).toBe(0);
  }, 180_000);

  it("load with require() from the packed copy, every entry", async () => {
    const probe =
      'const names = ["pg-outbox-worker", "pg-outbox-worker/testing", "pg-outbox-worker/inbox"];' +
      "console.log(JSON.stringify(names.map((n) => Object.keys(require(n)).length > 0)));";
    const out = await run(process.execPath, ["--no-warnings", "-e", probe], app);
    expect(out).toEqual({ code: 0, text: "[true,true,true]\n" });
  }, 60_000);
});
