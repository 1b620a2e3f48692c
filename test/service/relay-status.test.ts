import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import type { Browser } from "playwright-core";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { chromiumMissing, launchChromium } from "../../scripts/support/chromium.js";
import { createConsole } from "../../src/console/console.js";
import { migrate } from "../../src/migrate/migrator.js";
import { ConfigError, loadServiceConfig, serviceConfigSchema } from "../../src/service/config.js";
import { startHttpServer } from "../../src/service/http-server.js";
import { createMetrics } from "../../src/service/metrics.js";
import { createReadiness } from "../../src/service/readiness.js";
import { createRelayStatus, type RelaysReport } from "../../src/service/relay-status.js";
import { startService } from "../../src/service/service.js";
import { registerSecrets } from "../../src/util/redact.js";
import { testDatabase } from "../support/database.js";
import { memoryLogger } from "../support/memory-logger.js";
import { startTcpProxy } from "../support/tcp-proxy.js";
import { publisherFor } from "../support/worker.js";

// Readiness is the database's alone: a relay's broker being down shows in /relays, the outbox_relay_state
// gauge and the console's Relays panel, and never takes the worker out of rotation.

const db = testDatabase("rstat");
/** In the webhook's URL and header: never served by any of the reports. */
const HOOK_TOKEN = "relayStatusTok-5d1c9e";
const HOOK_AUTH = "relayStatusAuth-0b7f42";

beforeAll(() => db.migrate());

const cleanups: (() => Promise<unknown>)[] = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup().catch(() => {});
});

/** A port nothing listens on: one the system handed out and that was closed again. */
async function closedPort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  await new Promise((resolve) => server.close(resolve));
  return port;
}

/** A webhook receiver that takes everything (204). */
async function receiver(): Promise<number> {
  const server: Server = createServer((req, res) => {
    req.resume();
    req.on("end", () => res.writeHead(204).end());
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  cleanups.push(() => new Promise((resolve) => server.close(resolve)));
  return (server.address() as AddressInfo).port;
}

/** The real service on a schema of its own, relaying queue "hook" to a webhook on `hookPort`. */
async function serve(opts: { hookPort: number; databaseUrl?: string; console?: boolean }) {
  const schema = db.freshSchema("svc");
  await migrate({ connection: db.pool, schema });
  const config = serviceConfigSchema.parse({
    databaseUrl: opts.databaseUrl ?? db.url,
    schema,
    relays: {
      hook: {
        type: "http",
        url: `http://127.0.0.1:${opts.hookPort}/orders?token=${HOOK_TOKEN}`,
        headers: { authorization: `Bearer ${HOOK_AUTH}` },
        timeoutMs: 1000,
      },
    },
    http: { port: 0, gaugeIntervalMs: 100 },
    // An outage of the test's own making must not end the worker: readiness is what is watched.
    worker: { minPollIntervalMs: 20, maxPollIntervalMs: 200, maxConsecutiveFailures: 1000 },
    ...(opts.console ? { console: { enabled: true } } : {}),
  });
  const service = await startService(config, memoryLogger().logger);
  cleanups.push(() => service.stop());
  const base = `http://127.0.0.1:${service.httpPort}`;
  const publish = (queue: string) =>
    db.inTransaction((c) => publisherFor(schema).publish(c, queue, { at: Date.now() }));
  return { service, base, publish };
}

async function getJson<T>(url: string): Promise<{ status: number; body: T; text: string }> {
  const res = await fetch(url);
  const text = await res.text();
  return { status: res.status, body: JSON.parse(text) as T, text };
}

interface Readyz {
  ready: boolean;
  checks: Record<string, { ok: boolean; error?: string }>;
}

const readyzStatus = async (base: string) => (await fetch(`${base}/readyz`)).status;
const relayState = async (base: string, queue: string) =>
  (await getJson<RelaysReport>(`${base}/relays`)).body.relays[queue]?.state;

function expectNoSecret(where: string, text: string) {
  for (const secret of [HOOK_TOKEN, HOOK_AUTH])
    expect(text, `${where} shows ${secret}`).not.toContain(secret);
}

describe("a relay whose broker is down", () => {
  it("leaves /readyz 200, and shows in /relays, outbox_relay_state and the console's api/relays", async () => {
    const port = await closedPort();
    const { base, publish } = await serve({ hookPort: port, console: true });
    // An HTTP relay learns its receiver is gone from a request: one message makes it try.
    await publish("hook");
    await expect.poll(() => relayState(base, "hook")).toBe("unreachable");

    // Before: /readyz answered 503 with checks.relays failing, so every replica left rotation at once.
    await expect.poll(() => readyzStatus(base)).toBe(200);
    const ready = await getJson<Readyz>(`${base}/readyz`);
    expect(ready.body.ready).toBe(true);
    expect(Object.keys(ready.body.checks).sort()).toEqual(["database", "listener", "migrations", "worker"]);

    // Nothing made the receiver come back: it is still down while /readyz says ready.
    const relays = await getJson<RelaysReport>(`${base}/relays`);
    expect(relays.status).toBe(200);
    expect(relays.body).toEqual({
      ok: false,
      relays: {
        hook: {
          type: "http",
          state: "unreachable",
          target: `POST http://127.0.0.1:${port}/orders?…`,
          error: expect.stringContaining("request failed"),
        },
      },
    });
    expectNoSecret("/relays", relays.text);

    // The gauge follows at the next refresh: one series per state, 1 for the current one.
    const sample = (text: string, state: string) =>
      new RegExp(`^outbox_relay_state\\{queue="hook",type="http",state="${state}"\\} (\\d+)$`, "m").exec(
        text,
      )?.[1];
    await expect
      .poll(async () => sample(await (await fetch(`${base}/metrics`)).text(), "unreachable"))
      .toBe("1");
    const metrics = await (await fetch(`${base}/metrics`)).text();
    expect(sample(metrics, "ok")).toBe("0");
    expect(sample(metrics, "misconfigured")).toBe("0");
    expectNoSecret("/metrics", metrics);

    const api = await getJson<RelaysReport>(`${base}/console/api/relays`);
    expect(api.status).toBe(200);
    expect(api.body.relays.hook).toMatchObject({ type: "http", state: "unreachable" });
    expectNoSecret("console api/relays", api.text);
  });
});

describe("the database down", () => {
  it("makes /readyz 503 naming the database, while /relays still answers; back to 200 when it returns", async () => {
    const target = new URL(db.url);
    const proxy = await startTcpProxy({ host: target.hostname, port: Number(target.port || 5432) });
    cleanups.push(() => proxy.close());
    const proxied = new URL(db.url);
    proxied.hostname = "127.0.0.1";
    proxied.port = String(proxy.port);
    const { base } = await serve({ hookPort: await receiver(), databaseUrl: proxied.toString() });
    await expect.poll(() => readyzStatus(base)).toBe(200);

    proxy.cut();
    await expect.poll(() => readyzStatus(base)).toBe(503);
    const down = await getJson<Readyz>(`${base}/readyz`);
    expect(down.body.ready).toBe(false);
    expect(down.body.checks.database?.ok).toBe(false);
    expect(down.body.checks.database?.error).toEqual(expect.any(String));
    const relays = await getJson<RelaysReport>(`${base}/relays`);
    expect(relays.status).toBe(200);
    expect(relays.body.relays.hook?.state).toBe("ok");

    proxy.restore();
    await expect.poll(() => readyzStatus(base)).toBe(200);
  });
});

describe("the relay report, in process", () => {
  it("bounds each relay's probe, masks secrets in what a broker said, and is empty without relays", async () => {
    const secret = "relayStatusSecret-a9e3";
    registerSecrets(secret);
    const status = createRelayStatus({
      timeoutMs: 100,
      relays: {
        hung: { kind: "nats", health: () => new Promise(() => {}) },
        chatty: {
          kind: "redis",
          health: async () => ({
            state: "unreachable",
            target: `redis://u:${secret}@10.0.0.1:6379 stream s`,
            error: `WRONGPASS for ${secret} at redis://u:${secret}@10.0.0.1`,
          }),
        },
      },
    });
    const report = await status.check();
    expect(report.ok).toBe(false);
    expect(report.relays.hung).toEqual({
      type: "nats",
      state: "unreachable",
      target: "",
      error: "relay hung check timed out after 100 ms",
    });
    expect(report.relays.chatty?.state).toBe("unreachable");
    expect(JSON.stringify(report)).not.toContain(secret);
    expect(report.relays.chatty?.target).toContain("10.0.0.1:6379 stream s");
    expect(await createRelayStatus({ relays: {} }).check()).toEqual({ ok: true, relays: {} });
  });

  it("/relays without relays reports none, and answers GET only", async () => {
    const metrics = createMetrics({ pool: db.pool, schema: db.schema, collectDefault: false });
    const readiness = createReadiness({ pool: db.pool, schema: db.schema, listen: false });
    const http = await startHttpServer({ port: 0, metrics, readiness, logger: memoryLogger().logger });
    cleanups.push(() => http.close());
    const base = `http://127.0.0.1:${http.port}`;
    expect(await getJson(`${base}/relays`)).toMatchObject({ status: 200, body: { ok: true, relays: {} } });
    const post = await fetch(`${base}/relays`, { method: "POST" });
    expect(post.status).toBe(405);
  });

  it("refuses a console prefix that would shadow /relays, naming the field", async () => {
    let problems: string[] = [];
    try {
      await loadServiceConfig({ env: { OUTBOX_HTTP_PORT: "1", OUTBOX_CONSOLE_PATH_PREFIX: "/relays" } });
    } catch (error) {
      if (!(error instanceof ConfigError)) throw error;
      problems = error.problems;
    }
    expect(problems).toEqual([
      expect.stringMatching(
        /^console\.pathPrefix \(OUTBOX_CONSOLE_PATH_PREFIX\): must not clash with .*\/relays/,
      ),
    ]);
  });
});

const missing = chromiumMissing();
if (missing) console.warn(`relay-status.test: the browser test is skipped: ${missing}`);

describe.skipIf(missing !== undefined)("the console's Relays panel in a headless Chromium", () => {
  let browser: Browser;
  beforeAll(async () => {
    browser = await launchChromium();
  });
  afterAll(() => browser?.close());

  it("shows a relay that cannot reach its broker, and a broker's hostile answer as inert text", async () => {
    const port = await closedPort();
    const { base, publish } = await serve({ hookPort: port, console: true });
    await publish("hook");
    await expect.poll(() => relayState(base, "hook")).toBe("unreachable");

    // A second console whose relay report holds what a broker might send back: markup and a bidi override.
    const RLO = String.fromCharCode(0x202e);
    const hostile: RelaysReport = {
      ok: false,
      relays: {
        evil: {
          type: "nats",
          state: "misconfigured",
          target: `nats nats://127.0.0.1:4222 subject ${RLO}gpj.exe`,
          error: `<img src=x onerror="window.__pwned=1">`,
        },
      },
    };
    const consoleHandler = createConsole({
      db: db.pool,
      schema: db.schema,
      pathPrefix: "/console",
      relays: { check: async () => hostile },
    });
    const fake = await startHttpServer({
      port: 0,
      metrics: createMetrics({ pool: db.pool, schema: db.schema, collectDefault: false }),
      readiness: createReadiness({ pool: db.pool, schema: db.schema, listen: false }),
      console: consoleHandler,
      logger: memoryLogger().logger,
    });
    cleanups.push(() => fake.close());

    const page = await browser.newPage();
    const errors: string[] = [];
    page.on("pageerror", (e) => errors.push(`pageerror: ${e.message}`));
    try {
      await page.goto(`${base}/console/`);
      const row = page.locator('#relays tr[data-queue="hook"]');
      await expect.poll(() => row.locator('td[data-col="state"]').textContent()).toBe("unreachable");
      expect(await row.locator('td[data-col="state"]').getAttribute("class")).toBe("alarm");
      expect(await row.locator('td[data-col="type"]').textContent()).toBe("http");
      expect(await row.locator('td[data-col="target"]').textContent()).toBe(
        `POST http://127.0.0.1:${port}/orders?…`,
      );
      expect(await row.locator('td[data-col="error"]').textContent()).toContain("request failed");
      expectNoSecret("the Relays panel", (await page.locator("#relays").textContent()) ?? "");

      await page.goto(`http://127.0.0.1:${fake.port}/console/`);
      const evil = page.locator('#relays tr[data-queue="evil"]');
      await expect
        .poll(() => evil.locator('td[data-col="error"]').textContent())
        .toBe(hostile.relays.evil?.error);
      expect(await evil.locator('td[data-col="target"]').textContent()).toBe(
        "nats nats://127.0.0.1:4222 subject [U+202E]gpj.exe",
      );
      expect(await page.locator("#relays img").count()).toBe(0);
      expect(await page.evaluate(() => (globalThis as { __pwned?: number }).__pwned)).toBeUndefined();
      expect(errors).toEqual([]);
    } finally {
      await page.close();
    }
  });
});
