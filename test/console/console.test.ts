import { request } from "node:http";
import { networkInterfaces } from "node:os";
import path from "node:path";
import type { Logger } from "pino";
import type { Browser } from "playwright-core";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { chromiumMissing, launchChromium } from "../../scripts/support/chromium.js";
import {
  HOSTILE_ERROR,
  HOSTILE_PAYLOAD,
  SEEDED_COUNTS,
  SEEDED_SUBSCRIPTIONS,
  SEEDED_UNROUTED,
  seedConsoleDemo,
} from "../../scripts/support/console-seed.js";
import { createHistory } from "../../src/console/history.js";
import { ConfigError, loadServiceConfig, serviceConfigSchema } from "../../src/service/config.js";
import { type RunningService, startService } from "../../src/service/service.js";
import { subscribe } from "../../src/subscribe/subscriptions.js";
import type { Worker } from "../../src/worker/worker.js";
import { runCli } from "../support/cli-in-process.js";
import { testDatabase } from "../support/database.js";
import { type LogLine, memoryLogger } from "../support/memory-logger.js";

const db = testDatabase("cons");
const WRITE_TOKEN = "w-token-0123456789abcdef";
const READ_TOKEN = "r-token-0123456789abcdef";
let ids: { hostile: string; others: string[] };

beforeAll(async () => {
  await db.migrate();
  ids = await seedConsoleDemo(db.pool, db.schema);
});

const running: RunningService[] = [];
afterEach(async () => {
  for (const service of running.splice(0)) await service.stop();
});

/** The real service (worker, HTTP server, console) on this file's schema; the seeded queues have no handler. */
async function serve(console: Record<string, unknown> | undefined, logger?: Logger, host?: string) {
  const log = logger ?? memoryLogger().logger;
  const config = serviceConfigSchema.parse({
    databaseUrl: db.url,
    schema: db.schema,
    handlers: path.resolve("test/support/fixtures/handlers.ts"),
    http: { port: 0, ...(host ? { host } : {}) },
    ...(console ? { console } : {}),
  });
  const service = await startService(config, log);
  running.push(service);
  const base = `http://127.0.0.1:${service.httpPort}`;
  return { service, base };
}

async function get(url: string, token?: string) {
  const res = await fetch(url, { headers: token ? { authorization: `Bearer ${token}` } : {} });
  return { status: res.status, headers: res.headers, text: await res.text() };
}

async function post(url: string, body: unknown, token?: string) {
  const res = await fetch(url, {
    method: "POST",
    headers: { "content-type": "application/json", ...(token ? { authorization: `Bearer ${token}` } : {}) },
    body: JSON.stringify(body),
  });
  return { status: res.status, text: await res.text() };
}

/** A request with headers fetch will not set (Host) or sets itself; answers status, headers and body. */
function raw(
  base: string,
  path: string,
  headers: Record<string, string>,
  method = "GET",
  body?: string,
): Promise<{ status: number; headers: Record<string, unknown>; text: string }> {
  const url = new URL(path, base);
  return new Promise((resolve, reject) => {
    const req = request(
      { host: url.hostname, port: url.port, path: url.pathname + url.search, method, headers },
      (res) => {
        const chunks: Buffer[] = [];
        res.on("data", (c: Buffer) => chunks.push(c));
        res.on("end", () =>
          resolve({
            status: res.statusCode ?? 0,
            headers: res.headers,
            text: Buffer.concat(chunks).toString("utf8"),
          }),
        );
      },
    );
    req.on("error", reject);
    req.end(body);
  });
}

async function problemsOf(env: Record<string, string>): Promise<string[]> {
  try {
    await loadServiceConfig({ env });
  } catch (error) {
    if (error instanceof ConfigError) return error.problems;
    throw error;
  }
  throw new Error("expected a ConfigError");
}

async function rowCounts(id: string) {
  const { rows } = await db.pool.query<{ m: number; d: number }>(
    `SELECT (SELECT count(*)::int FROM ${db.names.messages} WHERE id = $1) AS m,
            (SELECT count(*)::int FROM ${db.names.deadLetters} WHERE id = $1) AS d`,
    [id],
  );
  return rows[0];
}

describe("console config", () => {
  it("is off by default, binds 127.0.0.1 by default, and refuses bad settings naming the field", async () => {
    const config = await loadServiceConfig({ env: {} });
    expect(config.console).toEqual({ enabled: false, pathPrefix: "/console", allowedHosts: [] });
    expect(config.http.host).toBe("127.0.0.1");

    expect(await problemsOf({ OUTBOX_CONSOLE_ENABLED: "true" })).toEqual([
      expect.stringMatching(
        /^console\.enabled \(OUTBOX_CONSOLE_ENABLED\): .*set http\.port \(OUTBOX_HTTP_PORT\)/,
      ),
    ]);
    for (const prefix of ["console", "/console/", "/metrics", "/healthz/x", "/a b", '/"><script>']) {
      const problems = await problemsOf({ OUTBOX_HTTP_PORT: "1", OUTBOX_CONSOLE_PATH_PREFIX: prefix });
      expect(problems, prefix).toEqual([
        expect.stringMatching(/^console\.pathPrefix \(OUTBOX_CONSOLE_PATH_PREFIX\): /),
      ]);
    }
    const short = await problemsOf({ OUTBOX_CONSOLE_WRITE_TOKEN: "short-secret" });
    expect(short).toEqual([
      expect.stringMatching(/^console\.writeToken \(OUTBOX_CONSOLE_WRITE_TOKEN\): must be at least 16/),
    ]);
    // The refused value is a secret: never quoted back.
    expect(short.join("\n")).not.toContain("short-secret");

    // Allowed host names: comma-separated in the environment; names only, no scheme, port or pattern.
    const hosts = await loadServiceConfig({
      env: { OUTBOX_CONSOLE_ALLOWED_HOSTS: " ops.example.com, .Corp.example ,," },
    });
    expect(hosts.console.allowedHosts).toEqual(["ops.example.com", ".Corp.example"]);
    for (const bad of ["https://ops.example.com", "ops.example.com:443", "*.example.com", "a b", "ops/x"]) {
      expect(await problemsOf({ OUTBOX_CONSOLE_ALLOWED_HOSTS: bad }), bad).toEqual([
        expect.stringMatching(
          /^console\.allowedHosts\[0\] \(OUTBOX_CONSOLE_ALLOWED_HOSTS\): must be a host name without scheme or port/,
        ),
      ]);
    }
  });
});

describe("console history (the chart's samples)", () => {
  it("samples the ready backlog and the rate of the observed worker's acks and dead letters", async () => {
    const listeners = new Map<string, () => void>();
    const worker = {
      on(event: string, listener: () => void) {
        listeners.set(event, listener);
        return () => listeners.delete(event);
      },
    } as unknown as Worker;
    const history = createHistory({ db: db.pool, schema: db.schema, intervalMs: 100 });
    const off = history.observe(worker);
    history.start();
    try {
      await expect.poll(() => history.samples().length).toBeGreaterThanOrEqual(1);
      for (let i = 0; i < 20; i++) listeners.get("acked")?.();
      listeners.get("dead_lettered")?.();
      await expect.poll(() => history.samples().some((s) => s.deliveredPerSec > 0)).toBe(true);
      const ready = Object.values(SEEDED_COUNTS).reduce((n, c) => n + c.ready, 0);
      const busy = history.samples().find((s) => s.deliveredPerSec > 0);
      expect(busy).toMatchObject({ ready });
      expect(busy?.deadPerSec).toBeGreaterThan(0);
      off();
      expect(listeners.size).toBe(0);
    } finally {
      await history.stop();
    }
  });
});

describe("console over HTTP", () => {
  it("`run` with the console on but no HTTP port exits 2 naming both settings", async () => {
    const result = await runCli(["run", "--handlers", "test/support/fixtures/handlers.ts"], {
      ...process.env,
      DATABASE_URL: db.url,
      OUTBOX_SCHEMA: db.schema,
      OUTBOX_HTTP_PORT: undefined,
      OUTBOX_CONSOLE_ENABLED: "true",
      OUTBOX_CONSOLE_WRITE_TOKEN: WRITE_TOKEN,
    });
    expect(result.code).toBe(2);
    expect(result.stderr).toMatch(
      /console\.enabled \(OUTBOX_CONSOLE_ENABLED\).*http\.port \(OUTBOX_HTTP_PORT\)/,
    );
    expect(result.stdout + result.stderr).not.toContain(WRITE_TOKEN);
  });

  it("answers 404 under the prefix when not enabled; the probes are unchanged", async () => {
    const { base } = await serve(undefined);
    expect((await get(`${base}/console/`)).status).toBe(404);
    expect((await get(`${base}/console/api/status`)).status).toBe(404);
    expect((await get(`${base}/healthz`)).status).toBe(200);
  });

  it("binds 127.0.0.1 unless told otherwise", async () => {
    const { lines, logger } = memoryLogger();
    const { service, base } = await serve({ enabled: true }, logger);
    expect((await get(`${base}/console/`)).status).toBe(200);
    const listening = lines.find((l) => l.msg.startsWith("http server listening"));
    expect(listening).toMatchObject({ host: "127.0.0.1", console: { path: "/console", writes: false } });
    const external = Object.values(networkInterfaces())
      .flat()
      .find((i) => i && i.family === "IPv4" && !i.internal)?.address;
    if (external) {
      await expect(fetch(`http://${external}:${service.httpPort}/healthz`)).rejects.toThrow();
    } else {
      console.warn(
        "console.test: no non-loopback IPv4 address here: the refused-from-outside check is skipped",
      );
    }
  });

  it("serves the page, script and style with a strict CSP, and open reads of the seeded state", async () => {
    const { base } = await serve({ enabled: true, writeToken: WRITE_TOKEN });
    const redirect = await fetch(`${base}/console`, { redirect: "manual" });
    expect(redirect.headers.get("location")).toBe("/console/");
    expect(redirect.headers.get("content-security-policy")).toContain("default-src 'none'");
    const page = await get(`${base}/console/`);
    expect(page.status).toBe(200);
    expect(page.headers.get("content-type")).toMatch(/^text\/html/);
    expect(page.text).toContain('<script src="/console/console.js" defer></script>');
    for (const [p, type] of [
      ["/console/", /^text\/html/],
      ["/console/console.js", /^text\/javascript/],
      ["/console/console.css", /^text\/css/],
      ["/console/api/status", /^application\/json/],
    ] as const) {
      const res = await get(`${base}${p}`);
      expect(res.status, p).toBe(200);
      expect(res.headers.get("content-type"), p).toMatch(type);
      const csp = res.headers.get("content-security-policy") ?? "";
      for (const directive of [
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "connect-src 'self'",
        "img-src 'self' data:",
        "frame-ancestors 'none'",
      ]) {
        expect(csp, p).toContain(directive);
      }
      expect(res.headers.get("x-content-type-options"), p).toBe("nosniff");
      expect(res.headers.get("referrer-policy"), p).toBe("no-referrer");
    }

    const status = JSON.parse((await get(`${base}/console/api/status`)).text);
    expect(status.writable).toBe(true);
    for (const [queue, counts] of Object.entries(SEEDED_COUNTS)) {
      expect(
        status.queues.find((q: { queue: string }) => q.queue === queue),
        queue,
      ).toMatchObject(counts);
    }
    expect(status.workers).toEqual(
      expect.arrayContaining([
        expect.objectContaining({ worker: "worker-a", held: 3, expired: 0 }),
        expect.objectContaining({ worker: "worker-b", held: 1, expired: 1 }),
      ]),
    );
    // Topics: pattern → queues, and the events no queue subscribed to, per topic, listed as dead letters.
    expect(status.subscriptions).toEqual(SEEDED_SUBSCRIPTIONS);
    expect(status.unrouted).toEqual({
      events: 3,
      topics: 2,
      byTopic: [
        {
          topic: "refund.requested",
          events: SEEDED_UNROUTED["refund.requested"],
          oldest_age_s: expect.any(Number),
        },
        {
          topic: "invoice.voided",
          events: SEEDED_UNROUTED["invoice.voided"],
          oldest_age_s: expect.any(Number),
        },
      ],
    });
    // Lists are pages ({ rows, next }) of previews; the whole record (headers too) is asked for by id.
    const kept = JSON.parse(
      (await get(`${base}/console/api/dead-letters?queue=refund.requested&reason=no_subscribers`)).text,
    );
    expect(kept.next).toBeNull();
    expect(kept.rows).toHaveLength(2);
    for (const { id } of kept.rows as { id: string }[]) {
      const whole = JSON.parse((await get(`${base}/console/api/dead-letters/${id}`)).text);
      expect(whole.headers["outbox-topic"]).toBe("refund.requested");
    }
    const peek = JSON.parse((await get(`${base}/console/api/peek?queue=orders&state=ready`)).text);
    expect(peek.rows).toHaveLength(SEEDED_COUNTS.orders.ready);
    const message = JSON.parse((await get(`${base}/console/api/messages/${peek.rows[0].id}`)).text);
    expect(message).toMatchObject({ id: peek.rows[0].id, queue: "orders", state: "ready" });
    expect(message.payload).toEqual(JSON.parse(peek.rows[0].payload_preview));
    expect((await get(`${base}/console/api/messages/999999999`)).status).toBe(404);
    const rejected = JSON.parse(
      (await get(`${base}/console/api/dead-letters?queue=orders&reason=rejected`)).text,
    );
    expect(rejected.rows.map((d: { id: string }) => d.id)).toEqual([ids.hostile]);
    const one = JSON.parse((await get(`${base}/console/api/dead-letters/${ids.hostile}`)).text);
    expect(one).toMatchObject({ id: ids.hostile, payload: HOSTILE_PAYLOAD, error: HOSTILE_ERROR });
    expect((await get(`${base}/console/api/dead-letters/999999999`)).status).toBe(404);
    const bad = await get(`${base}/console/api/dead-letters/abc`);
    expect(bad.status).toBe(400);
    expect(JSON.parse(bad.text).error).toMatch(/id: must be a positive whole number/);
    expect((await get(`${base}/console/api/peek?state=nonsense`)).status).toBe(400);
    expect((await get(`${base}/console/nothing-here`)).status).toBe(404);
  });

  it("serves under another prefix, and nothing of it under the default one", async () => {
    const { base } = await serve({ enabled: true, pathPrefix: "/ops/outbox" });
    const page = await get(`${base}/ops/outbox/`);
    expect(page.status).toBe(200);
    expect(page.text).toContain('<script src="/ops/outbox/console.js" defer></script>');
    expect((await get(`${base}/ops/outbox/api/status`)).status).toBe(200);
    expect((await get(`${base}/console/`)).status).toBe(404);
    expect((await get(`${base}/ops/outboxes`)).status).toBe(404);
    expect((await get(`${base}/metrics`)).status).toBe(200);
  });

  it("refuses writes when no write token is configured, saying so", async () => {
    const { base } = await serve({ enabled: true });
    const status = JSON.parse((await get(`${base}/console/api/status`)).text);
    expect(status.writable).toBe(false);
    for (const action of ["replay", "purge"]) {
      const res = await post(
        `${base}/console/api/dead-letters/${action}`,
        { all: true, dryRun: true },
        "anything-at-all-x",
      );
      expect(res.status, action).toBe(403);
      expect(JSON.parse(res.text).error).toMatch(/writes are disabled: no write token is configured/);
    }
  });

  it("with a read token, every read needs it (or the write token); the page shell stays open", async () => {
    const { base } = await serve({ enabled: true, readToken: READ_TOKEN, writeToken: WRITE_TOKEN });
    expect((await get(`${base}/console/`)).status).toBe(200);
    expect((await get(`${base}/console/console.js`)).status).toBe(200);
    for (const p of [
      "/api/status",
      "/api/workers",
      "/api/peek",
      "/api/dead-letters",
      `/api/dead-letters/${ids.hostile}`,
      `/api/messages/${ids.others[0]}`,
    ]) {
      const none = await get(`${base}/console${p}`);
      expect(none.status, p).toBe(401);
      expect(none.headers.get("www-authenticate"), p).toMatch(/^Bearer/);
      expect((await get(`${base}/console${p}`, "wrong-token-0123456789")).status, p).toBe(403);
      // A dead letter's id is no message's: 404, past the token check.
      const expected = p.startsWith("/api/messages/") ? 404 : 200;
      expect((await get(`${base}/console${p}`, READ_TOKEN)).status, p).toBe(expected);
      expect((await get(`${base}/console${p}`, WRITE_TOKEN)).status, p).toBe(expected);
    }
  });

  it("writes need the write token: 401 without, 403 wrong or read-only; dry runs count, real calls act", async () => {
    const { lines, logger } = memoryLogger();
    const { base } = await serve({ enabled: true, readToken: READ_TOKEN, writeToken: WRITE_TOKEN }, logger);
    const replay = `${base}/console/api/dead-letters/replay`;
    const target = ids.others[1] as string;
    const bodies: string[] = [];
    const tracked = async (r: Promise<{ status: number; text: string }>) => {
      const res = await r;
      bodies.push(res.text);
      return res;
    };
    expect((await tracked(post(replay, { ids: [target] }))).status).toBe(401);
    expect((await tracked(post(replay, { ids: [target] }, "wrong-token-0123456789"))).status).toBe(403);
    expect((await tracked(post(replay, { ids: [target] }, READ_TOKEN))).status).toBe(403);
    expect(await rowCounts(target)).toEqual({ m: 0, d: 1 });

    // The confirmation's count: the same function as the CLI, changing nothing.
    const dry = await tracked(post(replay, { ids: [target], dryRun: true }, WRITE_TOKEN));
    expect(JSON.parse(dry.text)).toMatchObject({
      dryRun: true,
      replayed: 1,
      queues: [{ queue: "mail", replayed: 1 }],
    });
    expect(await rowCounts(target)).toEqual({ m: 0, d: 1 });
    const done = await tracked(post(replay, { ids: [target] }, WRITE_TOKEN));
    expect(JSON.parse(done.text)).toMatchObject({ dryRun: false, replayed: 1 });
    expect(await rowCounts(target)).toEqual({ m: 1, d: 0 });

    // A filterless replay is refused (the library wants { all: true }), as a 400 with its reason.
    const unfiltered = await tracked(post(replay, {}, WRITE_TOKEN));
    expect(unfiltered.status).toBe(400);
    expect(JSON.parse(unfiltered.text).error).toMatch(/all: true/);

    const purge = `${base}/console/api/dead-letters/purge`;
    const older = ids.others[0] as string; // 3 days old
    const dryPurge = await tracked(
      post(purge, { olderThan: "1d", queue: "orders", dryRun: true }, WRITE_TOKEN),
    );
    expect(JSON.parse(dryPurge.text)).toMatchObject({ dryRun: true, purged: 1 });
    expect(await rowCounts(older)).toEqual({ m: 0, d: 1 });
    expect((await tracked(post(purge, { olderThan: "soon" }, WRITE_TOKEN))).status).toBe(400);
    const realPurge = await tracked(post(purge, { olderThan: "1d", queue: "orders" }, WRITE_TOKEN));
    expect(JSON.parse(realPurge.text)).toMatchObject({ dryRun: false, purged: 1 });
    expect(await rowCounts(older)).toEqual({ m: 0, d: 0 });
    bodies.push((await get(`${base}/console/api/status`, READ_TOKEN)).text);

    // Neither token turns up in any answer or log line.
    const everything = [...bodies, ...lines.map((l: LogLine) => JSON.stringify(l))].join("\n");
    expect(everything).not.toContain(WRITE_TOKEN);
    expect(everything).not.toContain(READ_TOKEN);
    // Each real write is logged with the client's address and what it asked for and did; dry runs are not.
    const writes = lines.filter((l) => l.msg === "console replay" || l.msg === "console purge");
    expect(writes).toEqual([
      expect.objectContaining({
        msg: "console replay",
        client: expect.stringMatching(/127\.0\.0\.1$/),
        asked: { ids: [target] },
        replayed: 1,
        queues: [{ queue: "mail", replayed: 1, skipped: 0 }],
      }),
      expect.objectContaining({
        msg: "console purge",
        client: expect.stringMatching(/127\.0\.0\.1$/),
        asked: { olderThan: "1d", queue: "orders" },
        purged: 1,
      }),
    ]);
  });
});

describe("console against DNS rebinding and cross-origin writes", () => {
  it("answers only Hosts that name this server: IPs, localhost, http.host and console.allowedHosts", async () => {
    const { lines, logger } = memoryLogger();
    const { service, base } = await serve(
      { enabled: true, allowedHosts: ["ops.example.com", ".corp.example"] },
      logger,
    );
    const port = service.httpPort;
    // A page at evil.example whose name now resolves to 127.0.0.1: the browser sends its own name.
    for (const p of ["/console/api/peek", "/console/api/status", "/console/api/dead-letters", "/console/"]) {
      const res = await raw(base, p, { host: `evil.example:${port}` });
      expect(res.status, p).toBe(403);
      expect(res.headers["content-security-policy"], p).toContain("default-src 'none'");
      expect(JSON.parse(res.text).error, p).toMatch(
        /does not answer to the host "evil\.example": add it to console\.allowedHosts \(OUTBOX_CONSOLE_ALLOWED_HOSTS\)/,
      );
      expect(res.text, p).not.toContain("order");
    }
    for (const host of [
      "ops.example.com.evil.example",
      "evil-ops.example.com",
      "corp.example.evil",
      "localhost.evil.example",
    ]) {
      expect((await raw(base, "/console/api/peek", { host })).status, host).toBe(403);
    }
    for (const host of [
      `127.0.0.1:${port}`,
      `localhost:${port}`,
      `LOCALHOST.:${port}`,
      `[::1]:${port}`,
      `10.1.2.3:${port}`,
      "ops.example.com",
      `OPS.example.com:${port}`,
      "corp.example",
      "a.b.corp.example:443",
    ]) {
      expect((await raw(base, "/console/api/peek", { host })).status, host).toBe(200);
    }
    // The refusals are logged once per client and minute, with the client's address.
    const refused = lines.filter((l) => l.msg === "console refused a host");
    expect(refused).toEqual([
      expect.objectContaining({ client: expect.stringMatching(/127\.0\.0\.1$/), status: 403, suppressed: 0 }),
    ]);
  });

  it("refuses a write whose Origin is not the console's own page, before any token check", async () => {
    const { base, service } = await serve({ enabled: true, writeToken: WRITE_TOKEN });
    const port = service.httpPort as number;
    const target = ids.hostile;
    const replay = (origin: string | undefined, dryRun = false) =>
      raw(
        base,
        "/console/api/dead-letters/replay",
        {
          host: `127.0.0.1:${port}`,
          "content-type": "application/json",
          authorization: `Bearer ${WRITE_TOKEN}`,
          ...(origin ? { origin } : {}),
        },
        "POST",
        JSON.stringify({ ids: [target], dryRun }),
      );
    for (const origin of [
      "http://evil.example",
      `http://evil.example:${port}`,
      `http://127.0.0.1:${port + 1}`,
      "null",
    ]) {
      const res = await replay(origin);
      expect(res.status, origin).toBe(403);
      expect(JSON.parse(res.text).error, origin).toMatch(/only the console's own page may write/);
    }
    expect(await rowCounts(target)).toEqual({ m: 0, d: 1 });
    expect((await replay(`http://127.0.0.1:${port}`, true)).status).toBe(200);
    // No Origin (curl, a script): the token decides alone.
    expect((await replay(undefined, true)).status).toBe(200);
  });

  it("bound to a non-loopback address, refuses to start without a read token, in one line", async () => {
    const env = {
      OUTBOX_HTTP_PORT: "9464",
      OUTBOX_HTTP_HOST: "0.0.0.0",
      OUTBOX_CONSOLE_ENABLED: "true",
      OUTBOX_CONSOLE_WRITE_TOKEN: WRITE_TOKEN,
    };
    expect(await problemsOf(env)).toEqual([
      expect.stringMatching(
        /^console\.readToken \(OUTBOX_CONSOLE_READ_TOKEN\): required when the console is on and http\.host \(OUTBOX_HTTP_HOST\) is "0\.0\.0\.0", not a loopback address/,
      ),
    ]);
    for (const host of ["::", "10.0.0.5", "worker.internal"]) {
      expect(await problemsOf({ ...env, OUTBOX_HTTP_HOST: host }), host).toHaveLength(1);
    }
    for (const host of ["127.0.0.1", "127.0.0.2", "::1", "localhost"]) {
      await expect(
        loadServiceConfig({ env: { ...env, OUTBOX_HTTP_HOST: host } }),
        host,
      ).resolves.toBeDefined();
    }
    await expect(
      loadServiceConfig({ env: { ...env, OUTBOX_CONSOLE_READ_TOKEN: READ_TOKEN } }),
    ).resolves.toBeDefined();
    await expect(serve({ enabled: true }, undefined, "0.0.0.0")).rejects.toThrow(/console\.readToken/);

    // `run` says it in one line and exits 2 before connecting; neither token is printed.
    const result = await runCli(["run", "--handlers", "test/support/fixtures/handlers.ts"], {
      ...process.env,
      DATABASE_URL: db.url,
      OUTBOX_SCHEMA: db.schema,
      ...env,
    });
    expect(result.code).toBe(2);
    expect(result.stderr.split("\n").filter((l) => l.includes("console.readToken"))).toHaveLength(1);
    expect(result.stdout + result.stderr).not.toContain(WRITE_TOKEN);

    // With a read token it starts on 0.0.0.0, and reads need it.
    const { base } = await serve({ enabled: true, readToken: READ_TOKEN }, undefined, "0.0.0.0");
    expect((await get(`${base}/console/api/status`)).status).toBe(401);
    expect((await get(`${base}/console/api/status`, READ_TOKEN)).status).toBe(200);
  });

  it("logs refused tokens with the client's address, at most one line a minute per client, never the token", async () => {
    const { lines, logger } = memoryLogger();
    const { base } = await serve({ enabled: true, readToken: READ_TOKEN, writeToken: WRITE_TOKEN }, logger);
    const guesses = Array.from({ length: 6 }, (_, i) => `guess-${i}-0123456789abcdef`);
    for (const guess of guesses) {
      expect((await get(`${base}/console/api/peek`, guess)).status).toBe(403);
    }
    // The read token offered for a write is a refused token too; no token at all is not an attempt.
    expect(
      (await post(`${base}/console/api/dead-letters/purge`, { olderThan: "1d" }, READ_TOKEN)).status,
    ).toBe(403);
    expect((await get(`${base}/console/api/peek`)).status).toBe(401);
    const refused = lines.filter((l) => l.msg.startsWith("console refused a token"));
    expect(refused).toEqual([
      expect.objectContaining({
        client: expect.stringMatching(/127\.0\.0\.1$/),
        method: "GET",
        path: "/console/api/peek",
        status: 403,
        error: "wrong token",
        suppressed: 0,
      }),
    ]);
    const everything = lines.map((l) => JSON.stringify(l)).join("\n");
    for (const secret of [...guesses, READ_TOKEN, WRITE_TOKEN]) expect(everything).not.toContain(secret);
  });
});

/** Both tables emptied and seeded afresh. */
async function reseed() {
  await db.pool.query(`TRUNCATE ${db.names.messages}, ${db.names.deadLetters}`);
  return seedConsoleDemo(db.pool, db.schema);
}

const missing = chromiumMissing();
if (missing) console.warn(`console.test: the browser test is skipped: ${missing}`);

describe.skipIf(missing !== undefined)("console in a headless Chromium", () => {
  let browser: Browser;
  beforeAll(async () => {
    // Its own seeded state: no dependence on what the HTTP tests replayed or purged.
    ids = await reseed();
    browser = await launchChromium();
  });
  afterAll(() => browser?.close());

  it("shows the seeded counts, renders a hostile payload as text, and replays through the confirmation", async () => {
    const { base } = await serve({ enabled: true, writeToken: WRITE_TOKEN });
    const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
    const errors: string[] = [];
    page.on("console", (m) => {
      if (m.type() === "error") errors.push(`console: ${m.text()}`);
    });
    page.on("pageerror", (e) => errors.push(`pageerror: ${e.message}`));
    try {
      await page.goto(`${base}/console/`);
      for (const [queue, counts] of Object.entries(SEEDED_COUNTS)) {
        const row = page.locator(`#queues tr[data-queue="${queue}"]`);
        for (const [col, n] of Object.entries(counts)) {
          await expect
            .poll(() => row.locator(`td[data-col="${col}"]`).textContent(), { message: `${queue} ${col}` })
            .toBe(String(n));
        }
      }
      await expect
        .poll(() => page.locator('#workers tr[data-worker="worker-b"] td[data-col="expired"]').textContent())
        .toBe("1");

      const hostile = page.locator(`#dead tr[data-id="${ids.hostile}"]`);
      await expect
        .poll(() => hostile.locator('td[data-col="payload"]').textContent())
        .toContain("<script>window.__pwned=1</script><img src=x onerror=");
      expect(await hostile.locator('td[data-col="error"]').textContent()).toBe(HOSTILE_ERROR);
      await hostile.locator('button[data-action="view"]').click();
      await expect.poll(() => page.locator("#detail-body").textContent()).toContain("window.__pwned=1");
      expect(await page.locator("main script, main img, main b").count()).toBe(0);
      expect(await page.evaluate(() => (globalThis as { __pwned?: number }).__pwned)).toBeUndefined();

      // Replay one dead letter: token, button, confirmation with its count, confirm.
      const target = ids.others[1] as string;
      await page.fill("#token", WRITE_TOKEN);
      await page.click("#token-save");
      const button = page.locator(`#dead tr[data-id="${target}"] button[data-action="replay"]`);
      await expect.poll(() => button.isEnabled()).toBe(true);
      await button.click();
      await expect
        .poll(() => page.locator("#confirm-text").textContent())
        .toMatch(/This will replay 1 dead letter into/);
      expect(await page.locator("#confirm-queues").textContent()).toBe("queue mail: 1");
      expect(await rowCounts(target)).toEqual({ m: 0, d: 1 });
      await page.click("#confirm-yes");
      await expect.poll(() => rowCounts(target)).toEqual({ m: 1, d: 0 });
      await expect.poll(() => page.locator("#notice").textContent()).toBe("Replayed 1 dead letter.");
      await expect.poll(() => page.locator(`#dead tr[data-id="${target}"]`).count()).toBe(0);
      expect(await page.evaluate(() => (globalThis as { __pwned?: number }).__pwned)).toBeUndefined();
      expect(errors).toEqual([]);
    } finally {
      await page.close();
    }
  });

  it("shows subscriptions and kept topic events as text, lists them, and replays them to a new subscriber", async () => {
    // dead_letters.queue is free text: a kept event's "topic" written by hand may be markup.
    const hostileTopic = '<img src=x onerror="window.__pwned=4">';
    await db.pool.query(
      `INSERT INTO ${db.names.deadLetters} (id, queue, payload, headers, created_at, available_at,
         deliveries_count, attempts_count, failures_count, reason)
       VALUES (nextval(pg_get_serial_sequence($1, 'id')), $2, '{}', '{}', now(), now(), 0, 0, 0, 'no_subscribers')`,
      [db.names.messages, hostileTopic],
    );
    const { base } = await serve({ enabled: true, writeToken: WRITE_TOKEN });
    const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
    const errors: string[] = [];
    page.on("console", (m) => {
      if (m.type() === "error") errors.push(`console: ${m.text()}`);
    });
    page.on("pageerror", (e) => errors.push(`pageerror: ${e.message}`));
    try {
      await page.goto(`${base}/console/`);
      for (const { pattern, queues } of SEEDED_SUBSCRIPTIONS) {
        await expect
          .poll(() =>
            page.locator(`#subscriptions tr[data-pattern="${pattern}"] td[data-col="queues"]`).textContent(),
          )
          .toBe(queues.join(", "));
      }
      const refunds = page.locator('#unrouted tr[data-topic="refund.requested"]');
      await expect.poll(() => refunds.locator('td[data-col="events"]').textContent()).toBe("2");
      expect(await page.locator('#unrouted td[data-col="topic"]').allTextContents()).toEqual([
        "refund.requested",
        hostileTopic,
        "invoice.voided",
      ]);
      expect(await page.locator("#unrouted-note").textContent()).toMatch(
        /^4 events kept\. Subscribe a queue/,
      );
      expect(await page.locator("main img").count()).toBe(0);

      // List: the dead-letter table filtered to the topic's kept events.
      await refunds.locator('button[data-action="list"]').click();
      await expect
        .poll(() => page.locator('#dead td[data-col="reason"]').allTextContents())
        .toEqual(["no_subscribers", "no_subscribers"]);
      expect(await page.locator("#dead-queue").inputValue()).toBe("refund.requested");

      // Replay before anyone subscribes: nothing moves, and the page says why.
      await page.fill("#token", WRITE_TOKEN);
      await page.click("#token-save");
      const replay = refunds.locator('button[data-action="replay"]');
      await expect.poll(() => replay.isEnabled()).toBe(true);
      await replay.click();
      await expect
        .poll(() => page.locator("#notice").textContent())
        .toBe("Nothing to replay (2 skipped: their topic has no subscriber yet).");

      // Subscribed now: the replay fans them out to the new subscriber.
      await subscribe(db.pool, { schema: db.schema, topic: "refund.#", queue: "refunds" });
      await replay.click();
      await expect
        .poll(() => page.locator("#confirm-text").textContent())
        .toMatch(/This will replay 2 dead letters into/);
      expect(await page.locator("#confirm-queues").textContent()).toBe("topic refund.requested: 2");
      await page.click("#confirm-yes");
      await expect.poll(() => page.locator("#notice").textContent()).toBe("Replayed 2 dead letters.");
      await expect.poll(() => refunds.count()).toBe(0);
      const { rows } = await db.pool.query(
        `SELECT count(*)::int AS n FROM ${db.names.messages} WHERE queue = 'refunds'`,
      );
      expect(rows[0]?.n).toBe(2);
      await expect
        .poll(() =>
          page.locator('#subscriptions tr[data-pattern="refund.#"] td[data-col="queues"]').textContent(),
        )
        .toBe("refunds");
      expect(await page.evaluate(() => (globalThis as { __pwned?: number }).__pwned)).toBeUndefined();
      expect(errors).toEqual([]);
    } finally {
      await page.close();
    }
  });
});
