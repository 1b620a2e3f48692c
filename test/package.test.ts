import { execFile } from "node:child_process";
import { readFileSync } from "node:fs";
import { mkdir, mkdtemp, readFile, rm, symlink, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, inject, it } from "vitest";

/**
 * The package as a user gets it: built with `npm run build` into dist/ (what `npm pack` ships), loaded
 * by name from an app folder whose node_modules/pg-outbox-worker links to this repository, so Node
 * resolves it through package.json's `exports` as it would an installed copy.
 */

const exec = promisify(execFile);
const ROOT = path.resolve(".");
const VERSION = JSON.parse(readFileSync(path.join(ROOT, "package.json"), "utf8")).version as string;
const BROKER_CLIENTS = ["amqplib", "ioredis", "nats"];

let app: string;

/** Runs node in the app folder; never throws on a non-zero exit. */
async function node(
  args: string[],
  env: Record<string, string> = {},
): Promise<{ code: number; stdout: string; stderr: string }> {
  try {
    const { stdout, stderr } = await exec(process.execPath, args, {
      cwd: app,
      timeout: 30_000,
      env: { ...process.env, ...env },
    });
    return { code: 0, stdout, stderr };
  } catch (error) {
    const e = error as { code: number; stdout: string; stderr: string };
    return { code: e.code, stdout: e.stdout, stderr: e.stderr };
  }
}

beforeAll(async () => {
  try {
    await exec("npm", ["run", "build"], { cwd: ROOT, timeout: 170_000 });
  } catch (error) {
    const e = error as { stdout?: string; stderr?: string; message: string };
    throw new Error(`npm run build failed: ${e.message}\n${e.stdout ?? ""}${e.stderr ?? ""}`);
  }
  app = await mkdtemp(path.join(tmpdir(), "outbox-package-"));
  await mkdir(path.join(app, "node_modules"));
  await symlink(ROOT, path.join(app, "node_modules", "pg-outbox-worker"), "dir");
}, 180_000);

afterAll(async () => {
  if (app) await rm(app, { recursive: true, force: true });
});

describe("the built package", () => {
  it("loads by name from a CommonJS app (require) and from an ES module app (import)", async () => {
    const probe = `
      const outbox = MODULE;
      const names = ["createPublisher", "publish", "publishMany", "defineQueue", "createWorker", "handle",
        "migrate", "createRelay", "queueStatus", "PermanentError", "OutboxConfigError", "exponential"];
      console.log(JSON.stringify({
        missing: names.filter((name) => typeof outbox[name] !== "function"),
        schema: outbox.DEFAULT_SCHEMA,
        redacted: outbox.redactConnectionString("postgres://app:s3cret@db/orders"),
        version: VERSION,
      }));`;
    await writeFile(
      path.join(app, "app.cjs"),
      probe
        .replace("MODULE", 'require("pg-outbox-worker")')
        .replace("VERSION", 'require("pg-outbox-worker/package.json").version'),
    );
    await writeFile(
      path.join(app, "app.mjs"),
      probe
        .replace("MODULE", 'await import("pg-outbox-worker")')
        .replace(
          "VERSION",
          '(await import("pg-outbox-worker/package.json", { with: { type: "json" } })).default.version',
        ),
    );
    for (const file of ["app.cjs", "app.mjs"]) {
      const out = await node([file]);
      expect(out.stderr, file).not.toMatch(/Error/);
      expect(out.code, file).toBe(0);
      const result = JSON.parse(out.stdout);
      expect(result.missing, file).toEqual([]);
      expect(result.schema, file).toBe("outbox");
      expect(result.redacted, file).not.toContain("s3cret");
      expect(result.version, file).toBe(VERSION);
    }
  });

  it("does not load the broker clients until a relay of their type is created", async () => {
    // A resolve hook (module.register) records every module the app's imports resolve to, whatever its
    // format, in a file: amqplib, ioredis and nats are CommonJS, so an ESM-only check would miss them.
    const record = path.join(app, "resolved.txt");
    await writeFile(
      path.join(app, "hooks.mjs"),
      `import { appendFileSync } from "node:fs";
      let file;
      export function initialize(data) { file = data.file; }
      export async function resolve(specifier, context, next) {
        const result = await next(specifier, context);
        appendFileSync(file, result.url + "\\n");
        return result;
      }`,
    );
    await writeFile(
      path.join(app, "register.mjs"),
      `import { register } from "node:module";
      register("./hooks.mjs", import.meta.url, { data: { file: ${JSON.stringify(record)} } });`,
    );
    await writeFile(
      path.join(app, "producer.mjs"),
      `import { readFileSync, writeFileSync } from "node:fs";
      const resolved = () => readFileSync(${JSON.stringify(record)}, "utf8").trim().split("\\n");
      const { createRelay } = await import("pg-outbox-worker");
      const afterImport = resolved();
      const logger = { child: () => logger, debug() {}, info() {}, warn() {}, error() {} };
      const http = await createRelay({ type: "http", url: "http://127.0.0.1:9/hook" }, { logger });
      await http.close();
      const afterHttp = resolved();
      // The control: createRelay loads the client of a relay type it is given (the broker need not answer).
      const redis = await createRelay({ type: "redis", url: "redis://127.0.0.1:9", stream: "s" }, { logger });
      await redis.close();
      const afterRedis = resolved();
      // To a file rather than stdout: process.exit does not wait for a piped stdout to drain.
      writeFileSync("result.json", JSON.stringify({ afterImport, afterHttp, afterRedis }));
      process.exit(0);`,
    );
    const out = await node(["--import", "./register.mjs", "producer.mjs"]);
    expect(out.stderr).not.toMatch(/Error/);
    expect(out.code).toBe(0);
    const { afterImport, afterHttp, afterRedis } = JSON.parse(
      await readFile(path.join(app, "result.json"), "utf8"),
    ) as Record<string, string[]>;
    const loaded = (urls: string[] | undefined, name: string) =>
      (urls ?? []).some((url) => url.includes(`/node_modules/${name}/`));
    // The hook sees the package's other dependencies, so it would see a broker client too.
    for (const dependency of ["pg", "kysely", "zod"])
      expect(loaded(afterImport, dependency), dependency).toBe(true);
    for (const client of BROKER_CLIENTS) {
      expect(loaded(afterImport, client), `${client} after import`).toBe(false);
      expect(loaded(afterHttp, client), `${client} after an http relay`).toBe(false);
    }
    expect(loaded(afterRedis, "ioredis")).toBe(true);
  });
});

describe("the built CLI", () => {
  const cli = (...args: string[]) => node([path.join(ROOT, "dist/cli/main.js"), ...args]);

  it("prints the package version for --version and -v", async () => {
    for (const flag of ["--version", "-v"]) {
      const out = await cli(flag);
      expect(out, flag).toEqual({ code: 0, stdout: `${VERSION}\n`, stderr: "" });
    }
  });

  it("prints a command's help for help <command>, and refuses an unknown one", async () => {
    const run = await cli("help", "run");
    expect(run.code).toBe(0);
    expect(run.stdout).toMatch(/^Usage: outbox-worker run /);
    const migrate = await cli("help", "migrate");
    expect(migrate.stdout).toMatch(/^Usage: outbox-worker migrate/);
    const unknown = await cli("help", "frobnicate");
    expect(unknown.code).toBe(2);
    expect(unknown.stderr).toContain('unknown command "frobnicate"');
  });

  it("loads a TypeScript config file and handlers module (tsx in the project, as a TypeScript app has it)", async () => {
    // A schema no one migrated: reaching that check proves both files loaded (a load error exits 2 first).
    const schema = `ts_${Date.now().toString(36)}`;
    await writeFile(
      path.join(app, "outbox.config.ts"),
      `interface Config { schema: string; worker: { concurrency: number } }\nconst config: Config = { schema: "${schema}", worker: { concurrency: 3 } };\nexport default config;\n`,
    );
    await writeFile(
      path.join(app, "handlers.ts"),
      "export default { fast: (_payload: unknown, message: { id: string }): void => void message.id };\n",
    );
    const out = await node(
      [
        path.join(ROOT, "dist/cli/main.js"),
        "run",
        "--config",
        "outbox.config.ts",
        "--handlers",
        "handlers.ts",
      ],
      { DATABASE_URL: inject("databaseUrl"), OUTBOX_LOG_PRETTY: "false" },
    );
    expect(out.stderr).not.toContain("Unknown file extension");
    expect(out.stderr).toContain(`schema "${schema}" is not migrated`);
    expect(out.code).toBe(1);
  });
});
