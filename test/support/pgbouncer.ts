import { type ChildProcess, spawn } from "node:child_process";
import { accessSync, constants } from "node:fs";
import { chmod, mkdtemp, rm, writeFile } from "node:fs/promises";
import net from "node:net";
import { tmpdir } from "node:os";
import path from "node:path";
import pg from "pg";
import { afterAll } from "vitest";

export type PoolMode = "transaction" | "session";

/** A real PgBouncer process in front of the test database, on its own 127.0.0.1 port. */
export interface PgBouncer {
  readonly poolMode: PoolMode;
  readonly port: number;
  /** The test database through the pooler: same user, password and database name. */
  readonly url: string;
  /** What PgBouncer printed so far (its log goes to stderr), for diagnostics. */
  output(): string;
  /** Stops the process (SIGTERM, then SIGKILL) and removes its temp folder. Idempotent. */
  stop(): Promise<void>;
}

export interface PgBouncerOptions {
  poolMode: PoolMode;
  /** Extra `[pgbouncer]` settings; none by default, so the pooler runs with its stock defaults. */
  settings?: Record<string, string | number>;
  /** How long to wait for the first query through the pooler to succeed. */
  readyTimeoutMs?: number;
}

const SEARCH = ["/usr/sbin", "/usr/local/sbin", "/usr/local/bin", "/usr/bin", "/opt/homebrew/bin"];

/** The pgbouncer executable: $PGBOUNCER, else the PATH, else the usual sbin folders; undefined if none. */
export function findPgBouncer(): string | undefined {
  if (process.env.PGBOUNCER) return process.env.PGBOUNCER;
  const dirs = [...(process.env.PATH ?? "").split(path.delimiter).filter(Boolean), ...SEARCH];
  for (const dir of dirs) {
    const candidate = path.join(dir, "pgbouncer");
    try {
      accessSync(candidate, constants.X_OK);
      return candidate;
    } catch {
      // not here
    }
  }
  return undefined;
}

const running = new Set<ChildProcess>();
let exitHookInstalled = false;

/** A test worker that dies without running afterAll must not leave a pooler behind. */
function installExitHook() {
  if (exitHookInstalled) return;
  exitHookInstalled = true;
  process.once("exit", () => {
    for (const child of running) child.kill("SIGKILL");
  });
}

function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = net.createServer();
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const address = server.address();
      const port = typeof address === "object" && address ? address.port : 0;
      server.close(() => resolve(port));
    });
  });
}

/** A value for pgbouncer.ini's connect string (`key=value`), quoted when it needs to be. */
function connectValue(value: string): string {
  return /^[A-Za-z0-9_./-]+$/.test(value) ? value : `'${value.replace(/\\/g, "\\\\").replace(/'/g, "\\'")}'`;
}

/** A userlist.txt field: double quotes, a doubled `"` inside. */
function userlistValue(value: string): string {
  return `"${value.replace(/"/g, '""')}"`;
}

/**
 * Starts PgBouncer in front of `databaseUrl` (the test database) and waits until a query goes through it.
 * Stock settings except: `pool_mode`, `listen_addr = 127.0.0.1` on a free port, no Unix socket (so runs
 * never collide on /tmp/.s.PGSQL.<port>), `auth_type = trust` with an auth_file that lists the URL's user
 * and password (PgBouncer logs in to Postgres with it). As root it runs as `postgres` (`-u`), since it
 * refuses to run as root; PGBOUNCER_USER names another user.
 */
export async function startPgBouncer(databaseUrl: string, options: PgBouncerOptions): Promise<PgBouncer> {
  const binary = findPgBouncer();
  if (!binary) throw new Error("pgbouncer is not installed (not on PATH nor in /usr/sbin; set PGBOUNCER)");
  const target = new URL(databaseUrl);
  const user = decodeURIComponent(target.username) || process.env.PGUSER || "postgres";
  const password = decodeURIComponent(target.password);
  const dbname = decodeURIComponent(target.pathname.replace(/^\//, "")) || user;
  const host = target.hostname.replace(/^\[(.*)\]$/, "$1") || "127.0.0.1";
  const serverPort = target.port || "5432";

  const dir = await mkdtemp(path.join(tmpdir(), "outbox-pgbouncer-"));
  // As root PgBouncer runs as another user, which must be able to read its config.
  await chmod(dir, 0o755);
  const failures: string[] = [];
  try {
    const userlist = path.join(dir, "userlist.txt");
    await writeFile(userlist, `${userlistValue(user)} ${userlistValue(password)}\n`, { mode: 0o644 });
    for (let attempt = 1; attempt <= 3; attempt++) {
      const port = await freePort();
      const ini = path.join(dir, "pgbouncer.ini");
      const settings: Record<string, string | number> = {
        listen_addr: "127.0.0.1",
        listen_port: port,
        unix_socket_dir: "",
        auth_type: "trust",
        auth_file: userlist,
        pool_mode: options.poolMode,
        ...options.settings,
      };
      await writeFile(
        ini,
        [
          "[databases]",
          `${connectValue(dbname)} = host=${connectValue(host)} port=${serverPort} dbname=${connectValue(dbname)}`,
          "",
          "[pgbouncer]",
          ...Object.entries(settings).map(([k, v]) => `${k} = ${v}`),
          "",
        ].join("\n"),
        { mode: 0o644 },
      );
      const asRoot = process.getuid?.() === 0;
      const args = asRoot ? ["-u", process.env.PGBOUNCER_USER ?? "postgres", ini] : [ini];
      const child = spawn(binary, args, { stdio: ["ignore", "ignore", "pipe"] });
      running.add(child);
      installExitHook();
      let log = "";
      child.stderr?.on("data", (chunk: Buffer) => {
        // The tail is enough for diagnostics; a long test must not keep every connection line.
        log = (log + chunk.toString()).slice(-64_000);
      });
      const spawnError = new Promise<Error>((resolve) => child.once("error", resolve));
      // A binary that cannot be run emits "error" and maybe never "exit": either means it is gone.
      const exited = Promise.race([
        new Promise<string>((resolve) =>
          child.once("exit", (code, signal) => resolve(`it exited (${signal ?? `code ${code}`})`)),
        ),
        spawnError.then((error) => `it could not be run (${error.message})`),
      ]).then((how) => {
        running.delete(child);
        return how;
      });
      const url = new URL(databaseUrl);
      url.hostname = "127.0.0.1";
      url.port = String(port);

      const ready = await waitReady(url.toString(), exited, options.readyTimeoutMs ?? 10_000);
      if (ready !== true) {
        child.kill("SIGKILL");
        await exited;
        // Its last lines, without their timestamp and pid, so that repeats of one failure read as one.
        const tail = log
          .trim()
          .split("\n")
          .slice(-3)
          .map((line) => line.replace(/^\S+ \S+ \S+ \[\d+\] /, ""))
          .join(" / ");
        failures.push(tail ? `${ready}: ${tail}` : ready);
        // Only a lost race for the port is worth another try; a binary that cannot be run is not.
        if (ready.startsWith("it could not be run")) break;
        continue;
      }
      let stopping: Promise<void> | undefined;
      return {
        poolMode: options.poolMode,
        port,
        url: url.toString(),
        output: () => log,
        stop() {
          stopping ??= (async () => {
            if (child.exitCode === null && child.signalCode === null) {
              child.kill("SIGTERM"); // PgBouncer: immediate shutdown
              const killer = setTimeout(() => child.kill("SIGKILL"), 5_000);
              await exited;
              clearTimeout(killer);
            }
            await rm(dir, { recursive: true, force: true });
          })();
          return stopping;
        },
      };
    }
    throw new Error(`pgbouncer (${binary}) did not start: ${[...new Set(failures)].join("; ")}`);
  } catch (error) {
    await rm(dir, { recursive: true, force: true });
    throw error;
  }
}

/** true once `SELECT 1` goes through the pooler, else why not. */
async function waitReady(url: string, exited: Promise<string>, timeoutMs: number): Promise<true | string> {
  const deadline = Date.now() + timeoutMs;
  let gone: string | undefined;
  void exited.then((how) => {
    gone = how;
  });
  let last = "";
  while (Date.now() < deadline) {
    if (gone) return gone;
    const client = new pg.Client({ connectionString: url, connectionTimeoutMillis: 1_000 });
    client.on("error", () => {});
    try {
      await client.connect();
      await client.query("SELECT 1");
      return true;
    } catch (error) {
      last = (error as Error).message;
    } finally {
      await client.end().catch(() => {});
    }
    if (gone) return gone;
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  return `no query went through it within ${timeoutMs} ms (last error: ${last})`;
}

/**
 * For a test file: starts a pooler at collection time (so `describe.skipIf` can use the outcome) and stops
 * it after the file. When PgBouncer is missing or cannot start, it prints why and returns the reason:
 * its tests are then skipped, never silently passed.
 */
export async function pgbouncerForTests(
  file: string,
  databaseUrl: string,
  options: PgBouncerOptions,
): Promise<{ bouncer: PgBouncer; skip: undefined } | { bouncer: undefined; skip: string }> {
  try {
    const bouncer = await startPgBouncer(databaseUrl, options);
    afterAll(() => bouncer.stop());
    return { bouncer, skip: undefined };
  } catch (error) {
    const skip = `PgBouncer (${options.poolMode} mode) unavailable: ${(error as Error).message}`;
    console.warn(`${file}: skipping its PgBouncer tests, ${skip}`);
    return { bouncer: undefined, skip };
  }
}
