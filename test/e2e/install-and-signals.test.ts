import { type ChildProcess, execFile, spawn, spawnSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { mkdir, mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { promisify } from "node:util";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { testDatabase } from "../support/database.js";
import { docSection, readDoc } from "../support/docs.js";

/**
 * The documented install line and the signal-safe ways to start the service, run as written: the package
 * packed with `npm pack` and installed from the tarball into an app folder (npm's cache first, the
 * registry only for what it lacks), then `run` started through each documented form and stopped with
 * SIGTERM. Done means the graceful-stop lines were logged and every process of the tree exited (the output
 * pipes, which each of them holds, closed).
 */

const exec = promisify(execFile);
const ROOT = path.resolve(".");
const PKG = JSON.parse(readFileSync(path.join(ROOT, "package.json"), "utf8")) as {
  name: string;
  version: string;
  bin: Record<string, string>;
  exports: Record<string, unknown>;
};
const TARBALL = `${PKG.name}-${PKG.version}.tgz`;
/** Where the install line and the signal-safe start forms are documented. */
const INSTALL_DOCS = ["README.md", "docs/guide/installing.md"];
const SERVICE_PAGE = readDoc("docs/operate/service.md");
const CONFIG = "outbox.config.json";

/** The forms docs/operate/service.md's "Start the service so that SIGTERM reaches it" shows, verbatim. */
const START_SCRIPT_LINE = `exec node_modules/.bin/outbox-worker run --config ${CONFIG}`;
const NPM_START_SCRIPT = `exec outbox-worker run --config ${CONFIG}`;
const NPX_EXEC = `exec outbox-worker run --config ${CONFIG}`;

const db = testDatabase("inst");
let work: string;
let app: string;
let packedFiles: string[];

beforeAll(async () => {
  await db.migrate();
  work = await mkdtemp(path.join(tmpdir(), "outbox-install-"));
  // `npm pack` in the clone, as the docs say; its prepack build is skipped: the global setup just
  // built dist/.
  const { stdout } = await exec(
    "npm",
    ["pack", "--ignore-scripts", "--json", "--pack-destination", work, "--loglevel=error"],
    { cwd: ROOT, timeout: 120_000 },
  );
  const [packed] = JSON.parse(stdout) as { filename: string; files: { path: string }[] }[];
  expect(packed?.filename).toBe(TARBALL);
  packedFiles = packed?.files.map((f) => f.path) ?? [];

  app = path.join(work, "app");
  await mkdir(app);
  await writeFile(
    path.join(app, "package.json"),
    JSON.stringify({ name: "app", version: "1.0.0", private: true, scripts: { start: NPM_START_SCRIPT } }),
  );
  await writeFile(path.join(app, "handlers.mjs"), "export default { 'sig.q': () => {} };\n");
  await writeFile(path.join(app, CONFIG), JSON.stringify({ schema: db.schema, handlers: "./handlers.mjs" }));
  // The documented line, from npm's cache where it has the dependencies; --omit=optional leaves out the
  // 60 MB embedded Postgres (docs/guide/installing.md names that flag too).
  await exec(
    "npm",
    [
      "install",
      path.join(work, TARBALL),
      "--prefer-offline",
      "--omit=optional",
      "--no-audit",
      "--no-fund",
      "--loglevel=error",
    ],
    { cwd: app, timeout: 300_000 },
  );
}, 420_000);

afterAll(async () => {
  if (work) await rm(work, { recursive: true, force: true });
});

describe("installing from the tarball, as the docs say", () => {
  it("documents the tarball the packing makes, and the published form for later", () => {
    for (const file of INSTALL_DOCS) {
      const section = docSection(file, file === "README.md" ? "## Installing" : "# Installing");
      expect(section, file).toContain("npm pack");
      expect(section, file).toContain(`→ ${TARBALL}`);
      expect(section, file).toContain(`npm install /path/to/${TARBALL}`);
      expect(section, file).toContain("`npm install pg-outbox-worker`");
    }
  });

  it("installs a working package: the bin, the main entry and pg-outbox-worker/testing", async () => {
    const manifest = JSON.parse(await readFile(path.join(app, "package.json"), "utf8"));
    expect(manifest.dependencies[PKG.name]).toBe(`file:../${TARBALL}`);
    // What bin and exports name is in the tarball.
    for (const target of Object.values(PKG.bin)) expect(packedFiles).toContain(target.replace(/^\.\//, ""));
    const { stdout: version } = await exec(path.join(app, "node_modules/.bin/outbox-worker"), ["--version"], {
      cwd: app,
    });
    expect(version.trim()).toBe(PKG.version);
    const probe = `const main = await import("pg-outbox-worker");
      const testing = await import("pg-outbox-worker/testing");
      const { createRequire } = await import("node:module");
      const required = createRequire(process.cwd() + "/")("pg-outbox-worker");
      console.log([typeof main.createWorker, typeof testing.testHandler, typeof required.publish].join(" "));`;
    const { stdout } = await exec(process.execPath, ["--input-type=module", "-e", probe], { cwd: app });
    expect(stdout.trim()).toBe("function function function");
  });
});

interface Started {
  child: ChildProcess;
  /** Started in a PID namespace of its own: the pids it logs are that namespace's. */
  namespaced: boolean;
  output(): string;
  /** JSON log lines of the worker (npm prints a banner too). */
  lines(): { msg: string; pid: number; level: number; [k: string]: unknown }[];
  waitFor(msg: string): Promise<void>;
  /** Resolves when the process has exited and every process that shares its output pipes has too. */
  closed: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
}

const started: Started[] = [];
afterEach(() => {
  // A test that failed may leave a worker behind (today's npx case): end it, by its own pid, once sure
  // that pid is still one of ours. Pids logged inside a PID namespace mean nothing out here.
  for (const s of started.splice(0)) {
    // A namespace goes with its PID 1 (npm, unshare's child); killing unshare alone would leave it.
    const others = s.namespaced ? [childOf(s)] : s.lines().map((l) => l.pid);
    for (const pid of new Set([...others, s.child.pid])) {
      if (pid !== undefined && pid > 0 && alive(pid) && ours(pid)) process.kill(pid, "SIGKILL");
    }
  }
});

function ours(pid: number): boolean {
  try {
    const cmdline = readFileSync(`/proc/${pid}/cmdline`, "utf8");
    return cmdline.includes("outbox-worker") || cmdline.includes("npm") || cmdline.includes("unshare");
  } catch {
    return false;
  }
}

function start(command: string, args: string[], options: { namespaced?: boolean } = {}): Started {
  const child = spawn(command, args, {
    cwd: app,
    env: {
      ...process.env,
      DATABASE_URL: db.url,
      OUTBOX_LOG_PRETTY: "false",
      OUTBOX_MIN_POLL_INTERVAL_MS: "20",
      OUTBOX_MAX_POLL_INTERVAL_MS: "200",
      npm_config_update_notifier: "false",
    },
    stdio: ["ignore", "pipe", "pipe"],
  });
  let out = "";
  let stdout = "";
  const waiters = new Set<() => void>();
  const onData = (chunk: Buffer) => {
    out += chunk.toString();
    for (const w of [...waiters]) w();
  };
  child.stdout?.on("data", (chunk: Buffer) => {
    stdout += chunk.toString();
    onData(chunk);
  });
  child.stderr?.on("data", onData);
  // The log's lines, whole ones only (a chunk may end mid-line); npm's own lines are not JSON.
  const lines = () =>
    stdout
      .split("\n")
      .slice(0, -1)
      .filter((l) => l.startsWith("{"))
      .map((l) => JSON.parse(l));
  const closed = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) =>
    child.once("close", (code, signal) => resolve({ code, signal })),
  );
  const s: Started = {
    child,
    namespaced: options.namespaced ?? false,
    output: () => out,
    lines,
    closed,
    waitFor: (msg) =>
      new Promise((resolve, reject) => {
        const check = () => {
          if (lines().some((l) => l.msg === msg)) {
            waiters.delete(check);
            resolve();
          }
        };
        waiters.add(check);
        closed.then(() => reject(new Error(`exited before logging "${msg}":\n${out}`)));
        check();
      }),
  };
  started.push(s);
  return s;
}

/** Still running (a zombie waiting for its reaper has exited). */
function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
  } catch {
    return false;
  }
  try {
    return readFileSync(`/proc/${pid}/stat`, "utf8").split(") ")[1]?.[0] !== "Z";
  } catch {
    return false;
  }
}

/**
 * Waits for the whole tree to end (bounded: today's `npx outbox-worker run` never ends), then checks the
 * worker logged a drained graceful stop and that no process it logged from is left.
 */
async function expectGracefulStop(s: Started, stopLine: string) {
  let timer: NodeJS.Timeout | undefined;
  const bound = new Promise<never>((_, reject) => {
    timer = setTimeout(
      () => reject(new Error(`the process tree did not end after SIGTERM:\n${s.output()}`)),
      90_000,
    );
  });
  const result = await Promise.race([s.closed, bound]).finally(() => clearTimeout(timer));
  const lines = s.lines();
  expect(
    lines.map((l) => l.msg),
    s.output(),
  ).toEqual(expect.arrayContaining([stopLine, "worker stopped"]));
  expect(lines.find((l) => l.msg === "worker stopped")).toMatchObject({ drained: true });
  // The closed pipes say every process exited; the pids say the worker was among them.
  if (!s.namespaced) {
    for (const pid of new Set(lines.map((l) => l.pid))) expect(alive(pid), `pid ${pid}`).toBe(false);
  }
  return result;
}

const SIGNAL_STOP = "stopping gracefully (send the signal again to exit at once)";
const NPM_SHELL_WARNING =
  "started by npm through a shell, which does not pass SIGTERM on: start it as `exec outbox-worker run …` where signals matter (docs/operate/service.md: Signals)";

describe("SIGTERM through each form the docs show", () => {
  it("shows these forms", () => {
    for (const form of [
      START_SCRIPT_LINE,
      `"start": "${NPM_START_SCRIPT}"`,
      `npx -c '${NPX_EXEC}'`,
      `CMD ["node_modules/.bin/outbox-worker", "run", "--config", "${CONFIG}"]`,
    ]) {
      expect(SERVICE_PAGE).toContain(form);
    }
  });

  it("a start script's `exec node_modules/.bin/outbox-worker run …`", { timeout: 300_000 }, async () => {
    const s = start("sh", ["-c", START_SCRIPT_LINE]);
    await s.waitFor("outbox-worker running");
    s.child.kill("SIGTERM");
    expect(await expectGracefulStop(s, SIGNAL_STOP)).toEqual({ code: 0, signal: null });
    expect(s.lines().map((l) => l.msg)).not.toContain(NPM_SHELL_WARNING);
  });

  it('`npm start` with `"start": "exec outbox-worker run …"`', { timeout: 300_000 }, async () => {
    const s = start("npm", ["start"]);
    await s.waitFor("outbox-worker running");
    s.child.kill("SIGTERM");
    expect(await expectGracefulStop(s, SIGNAL_STOP)).toEqual({ code: 0, signal: null });
    expect(s.lines().map((l) => l.msg)).not.toContain(NPM_SHELL_WARNING);
  });

  it("`npx -c 'exec outbox-worker run …'`", { timeout: 300_000 }, async () => {
    const s = start("npx", ["-c", NPX_EXEC]);
    await s.waitFor("outbox-worker running");
    s.child.kill("SIGTERM");
    expect(await expectGracefulStop(s, SIGNAL_STOP)).toEqual({ code: 0, signal: null });
  });

  it("plain `npx outbox-worker run …`: warned at start, stops by itself once npm's shell is gone", {
    timeout: 300_000,
  }, async () => {
    // npm signals its `sh -c`, which dies of it: before, the worker ran on, orphaned, and never stopped.
    const s = start("npx", ["outbox-worker", "run", "--config", CONFIG]);
    await s.waitFor("outbox-worker running");
    expect(s.lines().map((l) => l.msg)).toContain(NPM_SHELL_WARNING);
    s.child.kill("SIGTERM");
    await expectGracefulStop(
      s,
      "npm's shell exited (npm was stopped; the signal never reached this worker): stopping gracefully",
    );
  });
});

/** Why a PID namespace cannot be made here, or undefined when it can (root, or CAP_SYS_ADMIN). */
function pidNamespaceMissing(): string | undefined {
  const probe = spawnSync("unshare", ["--pid", "--fork", "--mount-proc", "true"], { encoding: "utf8" });
  if (probe.error) return `unshare is not available (${probe.error.message})`;
  if (probe.status !== 0) return `unshare cannot make a PID namespace here: ${probe.stderr.trim()}`;
  return undefined;
}
const noPidNamespace = pidNamespaceMissing();
if (noPidNamespace) console.warn(`install-and-signals.test: the PID 1 test is skipped: ${noPidNamespace}`);

describe.skipIf(noPidNamespace !== undefined)("as a container's PID 1", () => {
  it('`npm start` with `"start": "exec outbox-worker run …"` stops gracefully on SIGTERM to npm', {
    timeout: 300_000,
  }, async () => {
    const s = start("unshare", ["--pid", "--fork", "--mount-proc", "npm", "start"], { namespaced: true });
    await s.waitFor("outbox-worker running");
    // npm is PID 1 in its namespace, the child of unshare out here: signalled as `docker stop` does.
    const npm = childOf(s);
    expect(readFileSync(`/proc/${npm}/status`, "utf8")).toMatch(/^NSpid:\s+\d+\s+1$/m);
    process.kill(npm, "SIGTERM");
    expect(await expectGracefulStop(s, SIGNAL_STOP)).toEqual({ code: 0, signal: null });
  });

  it("plain `npx outbox-worker run` says at start that SIGTERM will kill it", {
    timeout: 300_000,
  }, async () => {
    const s = start(
      "unshare",
      ["--pid", "--fork", "--mount-proc", "npx", "outbox-worker", "run", "--config", CONFIG],
      {
        namespaced: true,
      },
    );
    await s.waitFor("outbox-worker running");
    expect(
      s
        .lines()
        .filter((l) => l.level === 50)
        .map((l) => l.msg),
    ).toEqual([
      "npm is PID 1 here (a container): on SIGTERM it exits at once and this worker dies with it, mid-delivery; start the worker itself (docs/operate/service.md: Signals)",
    ]);
    // The namespace goes with its PID 1, as a container does.
    process.kill(childOf(s), "SIGKILL");
    await s.closed;
  });
});

/** The process unshare forked: PID 1 of the namespace (NaN once gone). */
function childOf(s: Started): number {
  const pid = s.child.pid as number;
  try {
    return Number(readFileSync(`/proc/${pid}/task/${pid}/children`, "utf8").trim().split(" ")[0]);
  } catch {
    return Number.NaN;
  }
}
