import { execFile } from "node:child_process";
import { chmod, mkdtemp, rm, stat } from "node:fs/promises";
import { request } from "node:http";
import { homedir, tmpdir } from "node:os";
import path from "node:path";
import type { TestProject } from "vitest/node";
import { startEmbeddedPostgres } from "../../../src/embedded/embedded-postgres.js";
import { startTempGuard } from "./temp-guard.js";

declare module "vitest" {
  export interface ProvidedContext {
    databaseUrl: string;
  }
}

interface TestDatabase {
  source: string;
  url: string;
  stop(): Promise<void>;
}

export default async function setup({ provide }: TestProject): Promise<() => Promise<void>> {
  // First, so that every temp folder of the run (the embedded test database's too) lands in its folder.
  const guard = await startTempGuard();
  // The build runs while the database starts; both must be there before any test file runs.
  const built = build();
  let db: TestDatabase;
  try {
    db = await startTestDatabase();
  } catch (error) {
    await built.catch(() => {});
    await guard.check().catch(() => {});
    throw error;
  }
  try {
    await built;
  } catch (error) {
    await db.stop().catch(() => {});
    await guard.check().catch(() => {});
    throw error;
  }
  provide("databaseUrl", db.url);
  console.log(`test database: ${db.source} (${redactUrl(db.url)})`);
  return async () => {
    try {
      await db.stop();
    } finally {
      await guard.check();
    }
  };
}

/**
 * `npm run build` into dist/, once per run: the package tests load it as an installed copy, and the
 * tests that need the CLI as a real process (signals, graceful stop, exit timing, the embedded server)
 * run `node dist/cli/main.js`, which starts far faster than the sources under tsx. Every other CLI test
 * calls main(argv, io) in-process (test/support/cli-in-process.ts).
 */
function build(): Promise<void> {
  const started = Date.now();
  return new Promise((resolve, reject) => {
    // Minutes on a busy machine: a limit against a hang only.
    execFile("npm", ["run", "-s", "build"], { timeout: 600_000 }, (error, stdout, stderr) => {
      if (error) reject(new Error(`npm run build failed: ${error.message}\n${stdout}${stderr}`));
      else {
        console.log(`built dist/ in ${Date.now() - started} ms`);
        resolve();
      }
    });
  });
}

async function startTestDatabase(): Promise<TestDatabase> {
  const fromEnv = process.env.DATABASE_URL;
  if (fromEnv) return { source: "DATABASE_URL", url: fromEnv, stop: async () => {} };
  if (await dockerAnswers()) return startContainer();
  return startEmbedded();
}

async function startContainer(): Promise<TestDatabase> {
  const { PostgreSqlContainer } = await import("@testcontainers/postgresql");
  const container = await new PostgreSqlContainer("postgres:16-alpine").start();
  return {
    source: "testcontainers postgres:16-alpine",
    url: container.getConnectionUri(),
    stop: async () => {
      await container.stop();
    },
  };
}

async function startEmbedded(): Promise<TestDatabase> {
  const root = await mkdtemp(path.join(tmpdir(), "outbox-test-pg-"));
  // As root the server runs as the "postgres" OS user, which must be able to enter this folder.
  await chmod(root, 0o755);
  try {
    // initdb and the start take seconds, minutes on a busy machine: the whole run waits for them anyway.
    const server = await startEmbeddedPostgres({
      dataDir: path.join(root, "pgdata"),
      startTimeoutMs: 300_000,
    });
    return {
      source: "embedded-postgres",
      url: server.url,
      stop: async () => {
        await server.stop();
        await rm(root, { recursive: true, force: true });
      },
    };
  } catch (err) {
    await rm(root, { recursive: true, force: true });
    throw err;
  }
}

/** True only when a Docker engine answers /_ping within 2 s; there is often none (CI sandboxes). */
async function dockerAnswers(): Promise<boolean> {
  for (const target of dockerTargets()) {
    if (target.socketPath && !(await exists(target.socketPath))) continue;
    if (await ping(target)) return true;
  }
  return false;
}

interface DockerTarget {
  socketPath?: string;
  host?: string;
  port?: number;
}

function dockerTargets(): DockerTarget[] {
  const dockerHost = process.env.DOCKER_HOST;
  if (dockerHost) return [parseDockerHost(dockerHost)];
  const sockets = ["/var/run/docker.sock", path.join(homedir(), ".docker", "run", "docker.sock")];
  if (process.env.XDG_RUNTIME_DIR) sockets.push(path.join(process.env.XDG_RUNTIME_DIR, "docker.sock"));
  return sockets.map((socketPath) => ({ socketPath }));
}

function parseDockerHost(value: string): DockerTarget {
  if (value.startsWith("unix://")) return { socketPath: value.slice("unix://".length) };
  const url = new URL(value.replace(/^tcp:/, "http:"));
  return { host: url.hostname, port: Number(url.port || 2375) };
}

function ping(target: DockerTarget): Promise<boolean> {
  return new Promise((resolve) => {
    const req = request({ ...target, path: "/_ping", timeout: 2_000 }, (res) => {
      res.resume();
      resolve(res.statusCode === 200);
    });
    req.on("timeout", () => req.destroy());
    req.on("error", () => resolve(false));
    req.end();
  });
}

function exists(file: string): Promise<boolean> {
  return stat(file).then(
    () => true,
    () => false,
  );
}

function redactUrl(url: string): string {
  try {
    const parsed = new URL(url);
    if (parsed.password) parsed.password = "***";
    return parsed.toString();
  } catch {
    return url.replace(/\/\/([^:/@]*):[^@]*@/, "//$1:***@");
  }
}
