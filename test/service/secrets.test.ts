import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import path from "node:path";
import { Writable } from "node:stream";
import type pg from "pg";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { errorMessage } from "../../src/contract/handler-errors.js";
import { migrate } from "../../src/migrate/migrator.js";
import { createLogger } from "../../src/service/logger.js";
import { createReadiness } from "../../src/service/readiness.js";
import { registerConfigSecrets } from "../../src/service/secrets.js";
import { outboxNames } from "../../src/sql/names.js";
import { type CliProcess, startCli } from "../support/cli-process.js";
import { testDatabase } from "../support/database.js";
import { publisherFor, until } from "../support/worker.js";

/**
 * Issue 9, item 5: no credential of any URL or configured secret in any output of the service: logs,
 * last_error, dead letters, /readyz, /metrics and CLI output. Each canary is a value that must never be
 * seen again once it is configured.
 */
const db = testDatabase("sec");
const outbox = publisherFor(db.schema);
const running: CliProcess[] = [];
const dirs: string[] = [];

beforeAll(() => db.migrate());
afterEach(() => {
  for (const p of running.splice(0)) if (p.child.exitCode === null) p.child.kill("SIGKILL");
});
afterAll(async () => {
  for (const d of dirs) await rm(d, { recursive: true, force: true });
});

/** The test database URL with a password: its own (embedded Postgres), or a canary that trust auth ignores. */
function databaseUrlWithPassword(): { url: string; password: string } {
  const u = new URL(db.url);
  if (u.password) return { url: db.url, password: decodeURIComponent(u.password) };
  u.password = "canaryDbPw-4e1f";
  return { url: u.toString(), password: "canaryDbPw-4e1f" };
}

const CANARY = {
  natsToken: "canaryNatsTok-7a2c",
  redisPassword: "canaryRedisPw-19bd",
  amqpPassword: "canaryAmqpPw-c3d0",
  httpAuth: "canaryHttpAuth-58e6",
  httpQuery: "canaryQueryTok-6b71",
  /** A Standard Webhooks secret: its base64 key (what the scrubbing must catch, quoted with or without whsec_). */
  signingKey: "Y2FuYXJ5U2lnbmluZ0tleS0wZjlhMmItNDhjNy1hMQ==",
  /** The second secret of a rotation. */
  rotatedKey: "Y2FuYXJ5Um90YXRlZEtleS03YjFlOWQtYzIwNC1mZQ==",
  /** Never configured anywhere: only the URL pattern can hide it. */
  echoedPassword: "canaryEchoedPw-d41e",
};

/** Fails naming the sink and the canary, so a leak says where it is. */
function expectNoCanary(sink: string, text: string, canaries: readonly string[]) {
  for (const canary of canaries) {
    for (const form of new Set([canary, encodeURIComponent(canary)])) {
      if (text.includes(form)) expect.fail(`${sink} shows the canary ${form}:\n${text}`);
    }
  }
}

async function closedPort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as { port: number };
  await new Promise((resolve) => server.close(resolve));
  return port;
}

async function tempDir(): Promise<string> {
  const dir = await mkdtemp(path.join(tmpdir(), "outbox-secrets-"));
  dirs.push(dir);
  return dir;
}

function cli(args: string[], env: Record<string, string | undefined>): CliProcess {
  const p = startCli(args, { OUTBOX_SCHEMA: db.schema, OUTBOX_LOG_PRETTY: "false", ...env });
  running.push(p);
  return p;
}

async function rows<T>(sql: string): Promise<T[]> {
  return (await db.pool.query(sql)).rows as T[];
}

describe("a running service with credentials in every URL and relay", () => {
  it("shows none of them in its logs, last_error, dead letters, /readyz, /relays, /metrics, peek or dead-letters", async () => {
    const { url, password } = databaseUrlWithPassword();
    const canaries = [...Object.values(CANARY), password];
    const port = await closedPort();
    const relays = {
      "sec.nats": {
        type: "nats",
        servers: `nats://${CANARY.natsToken}@127.0.0.1:${port}`,
        subject: "sec.nats",
        timeoutMs: 1000,
      },
      "sec.redis": {
        type: "redis",
        url: `redis://default:${CANARY.redisPassword}@127.0.0.1:${port}`,
        stream: "sec",
        timeoutMs: 1000,
      },
      "sec.amqp": {
        type: "rabbitmq",
        url: `amqp://bob:${CANARY.amqpPassword}@127.0.0.1:${port}`,
        routingKey: "sec",
        timeoutMs: 1000,
      },
      "sec.http": {
        type: "http",
        url: `http://127.0.0.1:${port}/hook?token=${CANARY.httpQuery}`,
        headers: { authorization: `Bearer ${CANARY.httpAuth}` },
        signingSecret: [`whsec_${CANARY.signingKey}`, `whsec_${CANARY.rotatedKey}`],
        timeoutMs: 1000,
      },
    };
    // Handlers whose errors quote secrets, as a driver or an upstream answer may: one quoting configured
    // secrets without their URL (the registry's case), one a URL nobody configured (the pattern's case).
    const dir = await tempDir();
    const handlers = path.join(dir, "handlers.mjs");
    await writeFile(
      handlers,
      `const env = process.env;
export default {
  "sec.echo": () => {
    const error = new Error("upstream refused token " + env.SECRETS_TEST_TOKEN + " at amqp://bob:" + env.SECRETS_TEST_PW + "@10.0.0.1/vhost");
    error.permanent = true;
    throw error;
  },
  "sec.retry": () => {
    throw new Error("401 for Bearer " + env.SECRETS_TEST_AUTH + ", signed with " + env.SECRETS_TEST_SIGNING + " or " + env.SECRETS_TEST_ROTATED);
  },
};
`,
    );
    const queues = [...Object.keys(relays), "sec.echo", "sec.retry"];
    await db.inTransaction(async (c) => {
      for (const queue of queues) await outbox.publish(c, queue, { queue });
    });

    const service = cli(["run", "--http-port", "0"], {
      DATABASE_URL: url,
      OUTBOX_RELAYS: JSON.stringify(relays),
      OUTBOX_HANDLERS: handlers,
      OUTBOX_LOG_LEVEL: "debug",
      OUTBOX_MIN_POLL_INTERVAL_MS: "20",
      OUTBOX_MAX_POLL_INTERVAL_MS: "200",
      SECRETS_TEST_TOKEN: CANARY.natsToken,
      SECRETS_TEST_PW: CANARY.echoedPassword,
      SECRETS_TEST_AUTH: CANARY.httpAuth,
      SECRETS_TEST_SIGNING: `whsec_${CANARY.signingKey}`,
      SECRETS_TEST_ROTATED: CANARY.rotatedKey,
    });
    const { port: httpPort } = JSON.parse(await service.waitFor("http server listening", 30_000));
    await service.waitFor("outbox-worker running");

    const failing = [...Object.keys(relays), "sec.retry"];
    await until(
      async () => {
        const errors = await rows<{ queue: string }>(
          `SELECT queue FROM ${db.names.messages} WHERE last_error IS NOT NULL`,
        );
        const dead = await rows(`SELECT 1 FROM ${db.names.deadLetters} WHERE queue = 'sec.echo'`);
        return dead.length === 1 && failing.every((q) => errors.some((r) => r.queue === q));
      },
      "every relay and handler failure written",
      30_000,
    );

    const base = `http://127.0.0.1:${httpPort}`;
    const readyz = await (await fetch(`${base}/readyz`)).text();
    const relaysReport = await (await fetch(`${base}/relays`)).text();
    const metrics = await (await fetch(`${base}/metrics`)).text();
    expect(metrics).toContain('outbox_dead_lettered_total{queue="sec.echo",reason="rejected"} 1');

    const lastErrors = await rows<{ queue: string; last_error: string }>(
      `SELECT queue, last_error FROM ${db.names.messages} WHERE last_error IS NOT NULL ORDER BY queue`,
    );
    const deadLetters = await rows<{ error: string }>(`SELECT error FROM ${db.names.deadLetters}`);
    const peek = cli(["peek", "--json"], { DATABASE_URL: url });
    const listed = cli(["dead-letters", "list", "--json"], { DATABASE_URL: url });
    await Promise.all([peek.exited, listed.exited]);
    service.child.kill("SIGTERM");
    const exit = await service.exited;

    expectNoCanary("the service's stdout/stderr", service.output(), canaries);
    expectNoCanary("outbox.messages.last_error", JSON.stringify(lastErrors), canaries);
    expectNoCanary("outbox.dead_letters.error", JSON.stringify(deadLetters), canaries);
    expectNoCanary("/readyz", readyz, canaries);
    expectNoCanary("/relays", relaysReport, canaries);
    expectNoCanary("/metrics", metrics, canaries);
    expectNoCanary("outbox-worker peek --json", peek.output(), canaries);
    expectNoCanary("outbox-worker dead-letters list --json", listed.output(), canaries);

    // Not vacuous: each sink was there, and what is left of each error still says what failed and where.
    expect(exit.code, service.output()).toBe(0);
    expect(service.output()).toContain(`"servers":["nats://***@127.0.0.1:${port}"]`);
    expect(metrics).toContain('outbox_dead_lettered_total{queue="sec.echo",reason="rejected"} 1');
    // Every relay's broker is a closed port: /relays says so, with each relay's (scrubbed) error.
    expect(JSON.parse(readyz)).toMatchObject({ checks: { database: { ok: true }, worker: { ok: true } } });
    expect(JSON.parse(relaysReport)).toEqual({
      ok: false,
      relays: Object.fromEntries(
        Object.keys(relays).map((q) => [
          q,
          expect.objectContaining({ state: "unreachable", error: expect.any(String) }),
        ]),
      ),
    });
    const byQueue = Object.fromEntries(lastErrors.map((r) => [r.queue, r.last_error]));
    expect(byQueue["sec.nats"]).toContain(`nats://***@127.0.0.1:${port}`);
    expect(byQueue["sec.redis"]).toContain(`redis://***@127.0.0.1:${port}`);
    expect(byQueue["sec.amqp"]).toContain(`amqp://***@127.0.0.1:${port}`);
    expect(byQueue["sec.retry"]).toBe("Error: 401 for ***, signed with *** or ***");
    expect(deadLetters[0]?.error).toBe("Error: upstream refused token *** at amqp://***@10.0.0.1/vhost");
    expect(JSON.parse(peek.output())).toHaveLength(failing.length);
    expect(JSON.parse(listed.output())).toHaveLength(1);
  }, 300_000);
});

describe("CLI output of rows stored before redaction existed", () => {
  it("peek and dead-letters mask credentials in last_error, errors and payloads, as table and JSON", async () => {
    const schema = db.freshSchema("old");
    await migrate({ connection: db.pool, schema });
    const names = outboxNames(schema);
    const token = "canaryOldTok-2f7e";
    const password = "canaryOldPw-91ac";
    const { rows: inserted } = await db.pool.query(
      `INSERT INTO ${names.messages} (queue, payload, last_error) VALUES ('old', $1, $2) RETURNING id`,
      [
        { callback: `https://hooks.test/x?api_key=${password}` },
        `TransientError: nats nats://${token}@127.0.0.1:4222: cannot connect`,
      ],
    );
    await db.pool.query(
      `INSERT INTO ${names.deadLetters} (id, queue, payload, headers, created_at, available_at,
         deliveries_count, attempts_count, reason, error)
       VALUES ($1, 'old', '{}', '{}', now(), now(), 1, 1, 'rejected', $2)`,
      [inserted[0].id, `Error: redis redis://default:${password}@r:6379 refused`],
    );
    const env = { DATABASE_URL: db.url, OUTBOX_SCHEMA: schema };
    const outputs = await Promise.all(
      [
        ["peek"],
        ["peek", "--json"],
        ["dead-letters", "list"],
        ["dead-letters", "list", "--json"],
        ["dead-letters", "show", String(inserted[0].id)],
        ["dead-letters", "show", String(inserted[0].id), "--json"],
      ].map(async (args) => {
        const p = cli(args, env);
        expect((await p.exited).code, p.output()).toBe(0);
        return { args: args.join(" "), out: p.output() };
      }),
    );
    for (const { args, out } of outputs) {
      expectNoCanary(`outbox-worker ${args}`, out, [token, password]);
      if (args.endsWith("--json")) expect(() => JSON.parse(out), out).not.toThrow();
    }
    expect(outputs[1]?.out).toContain("nats://***@127.0.0.1:4222");
    expect(outputs[1]?.out).toContain("api_key=***");
    expect(outputs[5]?.out).toContain("redis://***@r:6379");
  }, 300_000);
});

describe("configuration that is not valid JSON", () => {
  const canary = "canaryRelaysTok-2d9e";

  it("OUTBOX_RELAYS: names the variable and the position, never the text", async () => {
    const p = cli(["run"], {
      DATABASE_URL: "postgres://nobody@127.0.0.1:1/none",
      // An unquoted URL: V8's own message would quote it.
      OUTBOX_RELAYS: `{"q": {"type": "nats", "servers": nats://${canary}@127.0.0.1:4222}}`,
    });
    expect((await p.exited).code, p.output()).toBe(2);
    expectNoCanary("the error output", p.output(), [canary]);
    expect(p.output()).toContain("relays (OUTBOX_RELAYS): not valid JSON");
    expect(p.output()).toContain("at line 1, column 35");
  });

  it("a JSON config file: names the file and the position, never the text", async () => {
    const file = path.join(await tempDir(), "outbox.json");
    await writeFile(file, `{\n  "relays": {\n    "q": { "type": "redis", "url": ${canary} }\n  }\n}\n`);
    const p = cli(["run", "--config", file], { DATABASE_URL: "postgres://nobody@127.0.0.1:1/none" });
    expect((await p.exited).code, p.output()).toBe(2);
    expectNoCanary("the error output", p.output(), [canary]);
    expect(p.output()).toContain(`config file ${file}: not valid JSON`);
    expect(p.output()).toContain("at line 3, column 36");
  });
});

describe("the choke points, in process", () => {
  const token = "canaryInProcTok-81f0";
  const password = "canaryInProcPw-a7c4";
  registerConfigSecrets({
    databaseUrl: undefined,
    relays: {
      q: {
        type: "nats",
        servers: [`nats://${token}@n1:4222`],
        subject: "s",
        timeoutMs: 5000,
        contentMode: "binary",
        ordered: true,
        eventType: "{queue}",
      },
    },
  });

  it("every log line, JSON or pretty, whatever field or error quotes a secret", () => {
    for (const pretty of [false, true]) {
      let out = "";
      const stream = new Writable({
        write(chunk, _encoding, done) {
          out += chunk.toString();
          done();
        },
      });
      const log = createLogger({ level: "info", pretty, stream });
      log
        .child({ servers: [`nats://${token}@n1:4222`] })
        .warn(
          { err: new Error(`auth failed for ${token}`), url: `redis://u:${password}@r:6379` },
          `connecting with "${token}"`,
        );
      expect(out).toContain("nats://***@n1:4222");
      expect(out).toContain("redis://***@r:6379");
      expectNoCanary(pretty ? "a pretty log line" : "a JSON log line", out, [token, password]);
      if (!pretty) expect(JSON.parse(out).msg).toBe('connecting with "***"');
    }
  });

  it("a signing secret, one or a rotation list, in a log line by field or quoted in an error", () => {
    // Registered: quoted with or without its whsec_ prefix, it is masked anywhere.
    const key = "Y2FuYXJ5SW5Qcm9jS2V5LTNjOWUtNzFhYi00ZDJmLWE=";
    const rotated = "Y2FuYXJ5SW5Qcm9jUm90LWU4MmQtNWYxMC05YjNhLWM=";
    registerConfigSecrets({
      databaseUrl: undefined,
      relays: {
        h: {
          type: "http",
          url: "http://hooks.test/h",
          method: "POST",
          timeoutMs: 1000,
          ordered: true,
          eventType: "{queue}",
          signingSecret: [`whsec_${key}`, `whsec_${rotated}`],
        },
      },
    });
    expect(errorMessage(new Error(`bad key ${key}, then whsec_${rotated}`), 4000)).toBe(
      "Error: bad key ***, then ***",
    );
    // Never registered (say, a config logged before it was parsed): the field names alone must hide it.
    const unregistered = [
      "whsec_Y2FuYXJ5TG9nT25seS1hYmNkLTEyMzQtNTY3OC05MGFi",
      "whsec_Y2FuYXJ5TG9nT25seTItZWZnaC0xMjM0LTU2Nzg=",
    ];
    let out = "";
    const stream = new Writable({
      write(chunk, _encoding, done) {
        out += chunk.toString();
        done();
      },
    });
    const log = createLogger({ level: "info", pretty: false, stream });
    log.info({ signingSecret: unregistered[0] }, "one");
    log.info({ relay: { signingSecret: unregistered } }, "nested list");
    log.info({ relays: { q: { type: "http", signingSecret: unregistered } } }, "service config");
    expect(out.split("\n").filter(Boolean)).toHaveLength(3);
    expectNoCanary("a JSON log line", out, unregistered);
  });

  it("errorMessage (every last_error and dead-letter error), also down the cause chain", () => {
    const error = new Error("publish failed", {
      cause: new Error(`nats://${token}@n1:4222 refused; retry with amqp://a:${password}@h`),
    });
    const text = errorMessage(error, 4000);
    expect(text).toBe(
      "Error: publish failed\ncaused by: Error: nats://***@n1:4222 refused; retry with amqp://***@h",
    );
    // Scrubbed before the cut: cut first, the tail "canaryInPr" would be kept and match no secret.
    const cut = errorMessage(new Error(`${"x".repeat(30)} ${token}`), 48);
    expect(cut).toBe(`Error: ${"x".repeat(30)} ***`);
  });

  it("/readyz error texts, when the driver quotes the pool's URL or its credentials", async () => {
    const ssl = "canaryInProcSsl-3b5d";
    const connectionString = `postgres://app:${password}@127.0.0.1:1/db?sslpassword=${ssl}`;
    const failure = () =>
      Promise.reject(new Error(`cannot reach ${connectionString} (password ${password}, ssl key ${ssl})`));
    const pool = { options: { connectionString }, query: failure, connect: failure } as unknown as pg.Pool;
    const report = await createReadiness({ pool, schema: db.schema, listen: false, timeoutMs: 500 }).check();
    expect(report.ready).toBe(false);
    expect(report.checks.database.error).toBe(
      "cannot reach postgres://***@127.0.0.1:1/db?sslpassword=*** (password ***, ssl key ***)",
    );
    expectNoCanary("/readyz", JSON.stringify(report), [password, ssl]);
  });
});
