import { execFile, spawnSync } from "node:child_process";
import { createHash, createHmac, pbkdf2Sync, randomBytes } from "node:crypto";
import { readFileSync } from "node:fs";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import path from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { parse } from "yaml";
import { testDatabase } from "../support/database.js";
import { readDoc } from "../support/docs.js";

/**
 * The Dockerfile and docker-compose.yml read as data (this machine has no Docker engine to run them):
 * what a `docker compose up --build` relies on, checked where a hand edit could break it. The pieces that
 * run without Docker run for real: the image's healthcheck probe against HTTP servers, and the compose
 * `roles` service's psql script against the test database.
 */

const ROOT = path.resolve(".");
const IMAGE_DOCKERFILE = path.join(ROOT, "Dockerfile");

interface Service {
  image?: string;
  build?: unknown;
  profiles?: string[];
  ports?: unknown[];
  pull_policy?: string;
  command?: string[] | string;
  entrypoint?: string[] | string;
  depends_on?: string[] | Record<string, { condition?: string }>;
  healthcheck?: { test?: string[] | string; disable?: boolean };
  environment?: Record<string, string>;
}

function compose(): Record<string, Service> {
  const file = parse(readFileSync(path.join(ROOT, "docker-compose.yml"), "utf8")) as {
    services: Record<string, Service>;
  };
  return file.services;
}

/** Dockerfile instructions of the final stage, continuation lines joined, comments dropped. */
function finalStage(): { instruction: string; args: string }[] {
  const text = readFileSync(IMAGE_DOCKERFILE, "utf8").replace(/\\\r?\n/g, " ");
  const lines = text
    .split(/\r?\n/)
    .map((line) => line.trim())
    .filter((line) => line !== "" && !line.startsWith("#"))
    .map((line) => {
      const [, instruction = "", args = ""] = /^(\S+)\s*(.*)$/.exec(line) ?? [];
      return { instruction: instruction.toUpperCase(), args: args.trim() };
    });
  const lastFrom = lines.map((l) => l.instruction).lastIndexOf("FROM");
  return lines.slice(lastFrom);
}

/** The final stage's HEALTHCHECK: its options and its exec-form command. */
function imageHealthcheck(): { argv: string[]; options: Record<string, string> } {
  const checks = finalStage().filter((l) => l.instruction === "HEALTHCHECK");
  expect(checks).toHaveLength(1);
  const args = checks[0]?.args ?? "";
  const match = /^((?:--[a-z-]+=\S+\s+)*)CMD\s+(\[.*\])$/.exec(args);
  expect(match, `exec form: HEALTHCHECK [options] CMD ["executable", ...], got ${args}`).not.toBeNull();
  const options = Object.fromEntries(
    (match?.[1] ?? "")
      .trim()
      .split(/\s+/)
      .filter(Boolean)
      .map((o) => o.replace(/^--/, "").split("=") as [string, string]),
  );
  return { argv: JSON.parse(match?.[2] ?? "[]") as string[], options };
}

/** "10s" → 10 (the forms used here: s and m). */
function seconds(duration: string): number {
  const match = /^(\d+)(s|m)$/.exec(duration);
  expect(match, `a duration like 10s, got ${duration}`).not.toBeNull();
  return Number(match?.[1]) * (match?.[2] === "m" ? 60 : 1);
}

/** The probe's own wait for an answer, plus 5 s for Node to start on a loaded host. */
function minimumTimeoutSeconds(): number {
  const probe = readFileSync(path.join(ROOT, "deploy", "docker", "healthcheck.cjs"), "utf8");
  const waitMs = Number(/const TIMEOUT_MS = (\d+);/.exec(probe)?.[1]);
  expect(waitMs).toBeGreaterThan(0);
  return waitMs / 1000 + 5;
}

/** The services that run the project's image: those with a `build`, and those naming its image. */
function projectServices(services: Record<string, Service>): [string, Service][] {
  const built = new Set(
    Object.values(services)
      .filter((s) => s.build !== undefined)
      .map((s) => s.image),
  );
  return Object.entries(services).filter(([, s]) => s.build !== undefined || built.has(s.image));
}

describe("docker-compose.yml", () => {
  it("builds the project's image once: one service has build, every other user of the image names it and never pulls it", () => {
    const services = compose();
    const builders = Object.entries(services).filter(([, s]) => s.build !== undefined);
    expect(builders.map(([name]) => name)).toHaveLength(1);
    const [, builder] = builders[0] as [string, Service];
    // Without an image name each service would build (and name) its own copy.
    expect(builder.image).toMatch(/^[a-z0-9][a-z0-9._/-]*:[a-z0-9._-]+$/);
    const users = projectServices(services);
    expect(users.map(([name]) => name).sort()).toEqual(["migrate", "producer", "worker"]);
    for (const [name, service] of users) {
      expect(service.image, name).toBe(builder.image);
      // Pulling a local-only image from a registry fails (or finds someone else's): never for the users.
      if (service.build === undefined) expect(service.pull_policy, name).toBe("never");
    }
    // Everything that runs the image waits, directly or not, for the builder, so it is built first.
    for (const [name, service] of users) {
      if (service.build !== undefined) continue;
      expect(Object.keys(service.depends_on ?? {}), name).toContain(builders[0]?.[0]);
    }
  });

  it("has a worker healthcheck that runs the image's probe, and none for one-shot users of the image", () => {
    const services = compose();
    const worker = services.worker?.healthcheck as Record<string, unknown> & { test?: string[] };
    expect(Array.isArray(worker.test), "exec form").toBe(true);
    // The same probe as the image's HEALTHCHECK, only asked more often.
    expect(worker.test).toEqual(["CMD", ...imageHealthcheck().argv]);
    expect(seconds(String(worker.timeout))).toBeGreaterThanOrEqual(minimumTimeoutSeconds());
    // The probe reads the port from OUTBOX_HTTP_PORT; the worker serves there.
    expect(JSON.stringify(services.worker)).toContain("9464");
    for (const name of ["migrate", "producer"]) {
      expect(services[name]?.healthcheck, name).toEqual({ disable: true });
    }
  });

  it("has no default password: each is a required variable, and none is written into a URL", () => {
    const services = compose();
    const required = new Set<string>();
    for (const [name, service] of Object.entries(services)) {
      for (const [key, value] of Object.entries(service.environment ?? {})) {
        const text = String(value);
        if (/PASSWORD/.test(key)) {
          // ${NAME:?message}: compose stops, naming it, when it is unset or empty.
          const match = /^\$\{([A-Z][A-Z0-9_]*):\?[^}]+\}$/.exec(text);
          expect(match, `${name}.${key} = ${text}`).not.toBeNull();
          required.add(match?.[1] as string);
        }
        if (/^postgres(ql)?:\/\//.test(text)) {
          // No user info beyond the user name (a ${VAR} in it would not even parse as a URL).
          expect(text, `${name}.${key}: a password in the URL`).not.toMatch(
            /^postgres(ql)?:\/\/[^/@:]*:[^@]*@/,
          );
          // The driver reads PGPASSWORD instead, beside the URL.
          expect(service.environment?.PGPASSWORD, `${name}: PGPASSWORD beside ${key}`).toBeDefined();
        }
      }
    }
    const raw = readFileSync(path.join(ROOT, "docker-compose.yml"), "utf8");
    // No fallback value for any of them, in any form (${X:-v}, ${X-v}).
    expect(raw).not.toMatch(/\$\{[A-Z0-9_]*PASSWORD[A-Z0-9_]*:?-/);
    expect([...required].sort()).toEqual([
      "OUTBOX_PRODUCER_PASSWORD",
      "OUTBOX_READER_PASSWORD",
      "OUTBOX_WORKER_PASSWORD",
      "POSTGRES_PASSWORD",
    ]);
    // The Docker page's line that generates a .env names exactly these.
    const page = readDoc("docs/operate/docker.md");
    const generator =
      /for v in ([A-Z_ ]+); do\s*\n\s*echo "\$v=\$\(openssl rand -hex \d+\)"; done > \.env/.exec(page);
    expect(generator, "docs/operate/docker.md: the .env generator").not.toBeNull();
    expect(generator?.[1]?.trim().split(/\s+/).sort()).toEqual([...required].sort());
    expect(readFileSync(path.join(ROOT, ".gitignore"), "utf8")).toMatch(/^\.env$/m);
  });

  it("gives every depends_on entry a condition, and starts the producer once the worker is healthy", () => {
    const services = compose();
    let entries = 0;
    for (const [name, service] of Object.entries(services)) {
      if (service.depends_on === undefined) continue;
      expect(Array.isArray(service.depends_on), `${name}: depends_on as a list has no conditions`).toBe(
        false,
      );
      for (const [dependency, spec] of Object.entries(service.depends_on)) {
        entries++;
        expect(services[dependency], `${name} depends on a service that does not exist`).toBeDefined();
        expect(
          ["service_started", "service_healthy", "service_completed_successfully"],
          `${name} → ${dependency}`,
        ).toContain(spec?.condition);
        if (spec?.condition === "service_healthy") {
          const check = services[dependency]?.healthcheck;
          expect(check?.test, `${dependency} needs a healthcheck for ${name} to wait on`).toBeDefined();
        }
      }
    }
    expect(entries).toBeGreaterThanOrEqual(4);
    const producer = services.producer?.depends_on as Record<string, { condition?: string }>;
    expect(producer.worker?.condition).toBe("service_healthy");
    expect(producer.migrate?.condition).toBe("service_completed_successfully");
    const worker = services.worker?.depends_on as Record<string, { condition?: string }>;
    expect(worker.migrate?.condition).toBe("service_completed_successfully");
  });

  it("publishes no Postgres port on the host by default (only a test-db profile does, on the loopback)", () => {
    const services = compose();
    expect(services.postgres?.ports ?? []).toEqual([]);
    const postgresImages = Object.entries(services).filter(([, s]) => s.image?.startsWith("postgres:"));
    for (const [name, service] of postgresImages) {
      if ((service.ports ?? []).length === 0) continue;
      expect(service.profiles, `${name} publishes Postgres; it must be in a profile`).toBeDefined();
      expect(service.profiles?.length, name).toBeGreaterThan(0);
      for (const port of service.ports ?? []) expect(String(port), name).toMatch(/^127\.0\.0\.1:/);
    }
    // By default (no profile) only the worker's metrics port is published, on the loopback.
    const published = Object.entries(services)
      .filter(([, s]) => !s.profiles?.length)
      .flatMap(([name, s]) => (s.ports ?? []).map((port) => `${name} ${String(port)}`));
    expect(published).toEqual(["worker 127.0.0.1:9464:9464"]);
  });
});

describe("Dockerfile", () => {
  it("has an exec-form HEALTHCHECK that runs the probe file with node, with room for a slow start", () => {
    const { argv, options } = imageHealthcheck();
    expect(argv).toEqual(["node", "healthcheck.cjs"]);
    // The file in the image is deploy/docker/healthcheck.cjs, copied into WORKDIR under that name.
    const stage = finalStage();
    expect(stage.find((l) => l.instruction === "WORKDIR")?.args).toBe("/app");
    expect(stage.map((l) => `${l.instruction} ${l.args}`)).toContain(
      "COPY deploy/docker/healthcheck.cjs ./healthcheck.cjs",
    );
    for (const option of ["interval", "timeout", "start-period", "retries"]) {
      expect(options[option], option).toBeDefined();
    }
    // Docker kills a probe at its timeout: it must outlast the probe's own wait, plus a Node start on a
    // loaded host (the CLI's healthcheck took 3.5–5.2 s there, against the old 5 s).
    expect(seconds(options.timeout ?? "0")).toBeGreaterThanOrEqual(minimumTimeoutSeconds());
  });

  it("serves HTTP on OUTBOX_HTTP_PORT, which the healthcheck reads, rather than a flag in CMD", () => {
    const stage = finalStage();
    const env = stage.filter((l) => l.instruction === "ENV").map((l) => l.args);
    expect(env).toContain("OUTBOX_HTTP_PORT=9464");
    const cmd = stage.find((l) => l.instruction === "CMD")?.args ?? "";
    expect(cmd).not.toContain("--http-port");
    // No embedded Postgres in the image: the run without DATABASE_URL is tested in package.test.ts.
    const install = stage.find((l) => l.instruction === "RUN" && l.args.includes("npm ci"))?.args ?? "";
    expect(install).toContain("--omit=optional");
  });
});

describe("the image's healthcheck probe (deploy/docker/healthcheck.cjs), run as Docker runs it", () => {
  const PROBE = path.join(ROOT, "deploy", "docker", "healthcheck.cjs");
  const servers: Server[] = [];
  afterAll(async () => {
    for (const server of servers) {
      server.closeAllConnections();
      await new Promise((closed) => server.close(closed));
    }
  });

  /** A server answering `status` (or never answering), recording the paths it was asked. */
  async function serve(status: number | "silent"): Promise<{ port: number; paths: string[] }> {
    const paths: string[] = [];
    const server = createServer((req, res) => {
      paths.push(req.url ?? "");
      if (status !== "silent") res.writeHead(status).end("{}");
    });
    servers.push(server);
    await new Promise<void>((listening) => server.listen(0, "127.0.0.1", listening));
    return { port: (server.address() as AddressInfo).port, paths };
  }

  /** The probe as the image runs it (`node healthcheck.cjs [path]`), with the image's environment. */
  function probe(port: number, args: string[] = []): Promise<{ code: number; stderr: string }> {
    return new Promise((resolve) => {
      execFile(
        process.execPath,
        [PROBE, ...args],
        { env: { PATH: process.env.PATH, OUTBOX_HTTP_PORT: String(port), OUTBOX_HTTP_HOST: "0.0.0.0" } },
        (error, _stdout, stderr) => resolve({ code: error ? Number(error.code) : 0, stderr }),
      );
    });
  }

  it("exits 0 when /readyz answers 200, asking it on the loopback for a bind-all host", async () => {
    const server = await serve(200);
    expect(await probe(server.port)).toEqual({ code: 0, stderr: "" });
    expect(server.paths).toEqual(["/readyz"]);
  });

  it("exits 1 on a 503, naming the answer; a path argument asks another endpoint", async () => {
    const server = await serve(503);
    const result = await probe(server.port);
    expect(result.code).toBe(1);
    expect(result.stderr).toMatch(/\/readyz: answered 503/);
    expect((await probe(server.port, ["/healthz"])).code).toBe(1);
    expect(server.paths).toEqual(["/readyz", "/healthz"]);
  });

  it("exits 1 when nothing listens, and gives up on a server that never answers", async () => {
    const closed = await serve(200);
    const port = closed.port;
    const server = servers.pop() as Server;
    await new Promise((done) => server.close(done));
    const refused = await probe(port);
    expect(refused.code).toBe(1);
    expect(refused.stderr).toMatch(/ECONNREFUSED/);
    const silent = await serve("silent");
    const timedOut = await probe(silent.port);
    expect(timedOut.code).toBe(1);
    expect(timedOut.stderr).toMatch(/no answer within \d+ ms/);
  });
});

describe("the compose `roles` service's script, run with psql as compose runs it", () => {
  const db = testDatabase("dkr");
  const psql = spawnSync("psql", ["--version"], { encoding: "utf8" });
  const missing = psql.error ? `psql is not installed (${psql.error.message})` : undefined;
  if (missing) console.warn(`docker.test.ts: skipping the roles script, ${missing}`);
  const tag = randomBytes(4).toString("hex");
  const roles = ["outbox_worker", "app_producer", "outbox_reader"];
  const renamed = (role: string) => `dkr_${role}_${tag}`;

  afterAll(async () => {
    for (const role of roles) {
      await db.pool.query(`DROP OWNED BY "${renamed(role)}"`).catch(() => {});
      await db.pool.query(`DROP ROLE IF EXISTS "${renamed(role)}"`);
    }
  });

  /** Does a pg_authid.rolpassword (SCRAM-SHA-256 or md5) hold this password? */
  function verifies(stored: string, password: string, role: string): boolean {
    if (stored.startsWith("md5")) {
      return (
        stored ===
        `md5${createHash("md5")
          .update(password + role)
          .digest("hex")}`
      );
    }
    const match = /^SCRAM-SHA-256\$(\d+):([^$]+)\$([^:]+):(.+)$/.exec(stored);
    if (!match) return false;
    const salted = pbkdf2Sync(
      password,
      Buffer.from(match[2] as string, "base64"),
      Number(match[1]),
      32,
      "sha256",
    );
    const clientKey = createHmac("sha256", salted).update("Client Key").digest();
    return createHash("sha256").update(clientKey).digest("base64") === match[3];
  }

  it.skipIf(missing !== undefined)(
    "gives each role LOGIN and the password of its variable, read with \\getenv",
    async () => {
      const service = compose().roles as Service;
      expect(service.entrypoint).toEqual(["/bin/sh", "-c"]);
      const script = (service.command as string[])[0] as string;
      // Compose would substitute a lone $ in the command itself (its own variables): the script has none.
      expect(script.replaceAll("$$", "")).not.toContain("$");
      for (const role of roles) expect(script).toContain(`ALTER ROLE ${role} LOGIN PASSWORD`);
      // The passwords reach psql through its environment only (\getenv), never its command line.
      expect(script).not.toMatch(/\$\$?\{?OUTBOX_\w*PASSWORD/);
      let local = script;
      for (const role of roles) local = local.replaceAll(role, renamed(role));
      // As `grant --create` leaves them: NOLOGIN, without a password.
      for (const role of roles) await db.pool.query(`CREATE ROLE "${renamed(role)}" NOLOGIN`);

      const url = new URL(db.url);
      const passwords = Object.fromEntries(
        ["OUTBOX_WORKER_PASSWORD", "OUTBOX_PRODUCER_PASSWORD", "OUTBOX_READER_PASSWORD"].map((v) => [
          v,
          randomBytes(18).toString("hex"),
        ]),
      );
      const result = spawnSync("/bin/sh", ["-c", local], {
        encoding: "utf8",
        env: {
          PATH: process.env.PATH,
          PGHOST: url.hostname,
          PGPORT: url.port || "5432",
          PGUSER: decodeURIComponent(url.username),
          PGPASSWORD: decodeURIComponent(url.password),
          PGDATABASE: url.pathname.slice(1),
          ...passwords,
        },
      });
      expect(result.stderr).toBe("");
      expect(result.status).toBe(0);
      const expected: Record<string, string | undefined> = {
        outbox_worker: passwords.OUTBOX_WORKER_PASSWORD,
        app_producer: passwords.OUTBOX_PRODUCER_PASSWORD,
        outbox_reader: passwords.OUTBOX_READER_PASSWORD,
      };
      for (const role of roles) {
        const { rows } = await db.pool.query<{ rolcanlogin: boolean; rolpassword: string | null }>(
          "SELECT rolcanlogin, rolpassword FROM pg_authid WHERE rolname = $1",
          [renamed(role)],
        );
        expect(rows[0]?.rolcanlogin, role).toBe(true);
        expect(verifies(rows[0]?.rolpassword ?? "", expected[role] as string, renamed(role)), role).toBe(
          true,
        );
      }
      // And the worker logs in as compose starts it: a DATABASE_URL without a password, PGPASSWORD beside
      // it (on a server that asks for passwords, as the compose one does, a wrong one is refused here).
      const asWorker = new URL(db.url);
      asWorker.username = renamed("outbox_worker");
      asWorker.password = "";
      const login = spawnSync(
        process.execPath,
        [
          "-e",
          "new (require('pg').Client)({ connectionString: process.env.DATABASE_URL }).connect().then(" +
            "(c) => c.query('SELECT current_user AS u').then((r) => { console.log(r.rows[0].u); return c.end(); })," +
            "(e) => { console.error(e.message); process.exit(1); })",
        ],
        {
          cwd: ROOT,
          encoding: "utf8",
          env: {
            PATH: process.env.PATH,
            DATABASE_URL: asWorker.toString(),
            PGPASSWORD: expected.outbox_worker,
          },
        },
      );
      expect(login.stderr).toBe("");
      expect(login.stdout.trim()).toBe(renamed("outbox_worker"));
    },
  );
});
