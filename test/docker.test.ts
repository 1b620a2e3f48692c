import { readFileSync } from "node:fs";
import path from "node:path";
import { describe, expect, it } from "vitest";
import { parse } from "yaml";

/**
 * The Dockerfile and docker-compose.yml read as data (this machine has no Docker engine to run them):
 * what a `docker compose up --build` relies on, checked where a hand edit could break it.
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

  it("has a worker healthcheck that runs the CLI's healthcheck with node, and none for one-shot users of the image", () => {
    const services = compose();
    const test = services.worker?.healthcheck?.test;
    expect(Array.isArray(test), "exec form").toBe(true);
    const argv = test as string[];
    expect(argv[0]).toBe("CMD");
    expect(argv.slice(1, 4)).toEqual(["node", "dist/cli/main.js", "healthcheck"]);
    expect(argv.join(" ")).not.toMatch(/curl|wget/);
    // The healthcheck reads the port from OUTBOX_HTTP_PORT; the worker serves there.
    expect(JSON.stringify(services.worker)).toContain("9464");
    for (const name of ["migrate", "producer"]) {
      expect(services[name]?.healthcheck, name).toEqual({ disable: true });
    }
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
  it("has an exec-form HEALTHCHECK that runs the CLI with node (the image has no curl or wget)", () => {
    const stage = finalStage();
    const checks = stage.filter((l) => l.instruction === "HEALTHCHECK");
    expect(checks).toHaveLength(1);
    const args = checks[0]?.args ?? "";
    const match = /^((?:--[a-z-]+=\S+\s+)*)CMD\s+(\[.*\])$/.exec(args);
    expect(match, `exec form: HEALTHCHECK [options] CMD ["executable", ...], got ${args}`).not.toBeNull();
    const argv = JSON.parse(match?.[2] ?? "[]") as string[];
    expect(argv.slice(0, 3)).toEqual(["node", "dist/cli/main.js", "healthcheck"]);
    expect(args).not.toMatch(/curl|wget/);
    const options = Object.fromEntries(
      (match?.[1] ?? "")
        .trim()
        .split(/\s+/)
        .filter(Boolean)
        .map((o) => o.replace(/^--/, "").split("=") as [string, string]),
    );
    for (const option of ["interval", "timeout", "start-period", "retries"]) {
      expect(options[option], option).toBeDefined();
    }
    // Docker kills a probe at its timeout: it must outlast the CLI's own 3 s default.
    expect(Number.parseInt(options.timeout ?? "0", 10)).toBeGreaterThan(3);
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
