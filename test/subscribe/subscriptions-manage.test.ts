import { randomBytes } from "node:crypto";
import { writeFile } from "node:fs/promises";
import http from "node:http";
import type { AddressInfo } from "node:net";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { OutboxConfigError } from "../../src/contract/errors.js";
import { ConfigError, serviceConfigSchema } from "../../src/service/config.js";
import { startService } from "../../src/service/service.js";
import { StartupError } from "../../src/service/startup.js";
import { listSubscriptions, subscribersOf } from "../../src/subscribe/subscriptions.js";
import { createWorker } from "../../src/worker/worker.js";
import { runCli } from "../support/cli-in-process.js";
import { execCli } from "../support/cli-process.js";
import { testDatabase } from "../support/database.js";
import { memoryLogger } from "../support/memory-logger.js";
import { testTempDir } from "../support/temp-dir.js";
import { publisherFor, until, workerFactory } from "../support/worker.js";

/**
 * Managing subscriptions: the CLI's subscribe, unsubscribe and subscriptions (list, --for), a worker's
 * queue `subscribe` applied at start (idempotent, add-only, refused with the grant that is missing), and the
 * service's `subscriptions` and relay `subscribe`, applied at start for the queues it serves only.
 */
const db = testDatabase("subm");
const { schema, names } = db;
const workers = workerFactory(db);
const outbox = publisherFor(schema);

const tag = randomBytes(4).toString("hex");
/** A worker role granted without --worker-can-subscribe (then with it), and an inspector. */
const role = { worker: `subm_worker_${tag}`, inspector: `subm_inspector_${tag}` };
// The embedded test server asks every login for a password (scram); a trust-auth server ignores it.
const ROLE_PASSWORD = randomBytes(12).toString("hex");

function urlAs(name: string): string {
  const url = new URL(db.url);
  url.username = name;
  url.password = ROLE_PASSWORD;
  return url.toString();
}

const cli = (args: string[], databaseUrl = db.url) =>
  runCli([...args, "--schema", schema], { PATH: process.env.PATH, DATABASE_URL: databaseUrl });

async function grant(args: string[]): Promise<void> {
  const result = await cli(["grant", ...args]);
  expect(result, result.stderr).toMatchObject({ code: 0 });
}

beforeAll(async () => {
  await db.migrate();
  for (const name of Object.values(role)) {
    await db.pool.query(`CREATE ROLE "${name}" LOGIN PASSWORD '${ROLE_PASSWORD}'`);
  }
  await grant(["--worker", role.worker, "--inspector", role.inspector]);
});

afterAll(async () => {
  // Roles are cluster-wide: leave none behind (DROP OWNED also takes their grants away).
  for (const name of Object.values(role)) {
    await db.pool.query(`DROP OWNED BY "${name}"`).catch(() => {});
    await db.pool.query(`DROP ROLE IF EXISTS "${name}"`);
  }
});

async function copies(topic: string): Promise<string[]> {
  const { rows } = await db.pool.query<{ queue: string }>(
    `SELECT queue FROM ${names.messages} WHERE headers->>'outbox-topic' = $1 ORDER BY queue`,
    [topic],
  );
  return rows.map((r) => r.queue);
}

async function publish(topic: string): Promise<void> {
  await db.inTransaction((c) => outbox.publishToTopic(c, topic, { at: topic }));
}

describe("outbox-worker subscribe, unsubscribe and subscriptions", () => {
  it("subscribe, list, --for, unsubscribe: idempotent both ways, and publishing follows each change", async () => {
    const first = await cli(["subscribe", "c.order.*", "c.billing"]);
    expect(first).toMatchObject({ code: 0, stderr: "" });
    expect(first.stdout).toMatch(/^subscribed queue c\.billing to c\.order\.\*/);
    const again = await cli(["subscribe", "c.order.*", "c.billing"]);
    expect(again).toMatchObject({ code: 0, stderr: "" });
    expect(again.stdout).toBe("queue c.billing is already subscribed to c.order.*; nothing changed\n");
    expect((await cli(["subscribe", "c.order.placed", "c.email"])).code).toBe(0);
    // Not a pattern order.placed matches: --for leaves it out of email's list.
    expect((await cli(["subscribe", "c.payment.#", "c.email"])).code).toBe(0);

    const table = await cli(["subscriptions"]);
    expect(table.code).toBe(0);
    const lines = table.stdout.trimEnd().split("\n");
    expect(lines[0]).toMatch(/^PATTERN\s+QUEUE\s+CREATED$/);
    expect(lines.slice(1).map((l) => l.split(/\s+/).slice(0, 2))).toEqual([
      ["c.order.*", "c.billing"],
      ["c.order.placed", "c.email"],
      ["c.payment.#", "c.email"],
    ]);

    const all = JSON.parse((await cli(["subscriptions", "--json"])).stdout);
    const stored = await listSubscriptions(db.pool, { schema });
    expect(all).toEqual(
      stored.map((s) => ({ pattern: s.topic, queue: s.queue, created_at: s.createdAt.toISOString() })),
    );
    expect(JSON.parse((await cli(["subscriptions", "--queue", "c.billing", "--json"])).stdout)).toEqual([
      expect.objectContaining({ pattern: "c.order.*", queue: "c.billing" }),
    ]);
    // --topic is the pattern exactly as subscribed, not the topics it matches.
    expect(JSON.parse((await cli(["subscriptions", "--topic", "c.order.placed", "--json"])).stdout)).toEqual([
      expect.objectContaining({ pattern: "c.order.placed", queue: "c.email" }),
    ]);

    const reach = await cli(["subscriptions", "--for", "c.order.placed", "--json"]);
    expect(JSON.parse(reach.stdout)).toEqual({
      topic: "c.order.placed",
      queues: [
        { queue: "c.billing", patterns: ["c.order.*"] },
        { queue: "c.email", patterns: ["c.order.placed"] },
      ],
    });
    expect(await subscribersOf(db.pool, "c.order.placed", { schema })).toEqual(["c.billing", "c.email"]);
    const reachText = await cli(["subscriptions", "--for", "c.order.placed"]);
    expect(reachText.stdout).toMatch(
      /reaches 2 queues:\nQUEUE\s+VIA\nc\.billing\s+c\.order\.\*\nc\.email\s+/,
    );
    const nobody = await cli(["subscriptions", "--for", "c.shipping.late"]);
    expect(nobody).toMatchObject({ code: 0 });
    expect(nobody.stdout).toMatch(/^no queue subscribes to c\.shipping\.late: .*no_subscribers/);

    await publish("c.order.placed");
    expect(await copies("c.order.placed")).toEqual(["c.billing", "c.email"]);

    const removed = await cli(["unsubscribe", "c.order.*", "c.billing"]);
    expect(removed).toMatchObject({ code: 0, stderr: "" });
    expect(removed.stdout).toMatch(
      /^unsubscribed queue c\.billing from c\.order\.\*.*copies already queued stay/,
    );
    const notThere = await cli(["unsubscribe", "c.order.*", "c.billing"]);
    expect(notThere).toMatchObject({ code: 0, stderr: "" });
    expect(notThere.stdout).toBe("queue c.billing was not subscribed to c.order.*; nothing changed\n");
    expect(JSON.parse((await cli(["subscriptions", "--for", "c.order.placed", "--json"])).stdout)).toEqual({
      topic: "c.order.placed",
      queues: [{ queue: "c.email", patterns: ["c.order.placed"] }],
    });
    // The copy queued before the unsubscribe stays; the next event reaches email only.
    await publish("c.order.placed");
    expect(await copies("c.order.placed")).toEqual(["c.billing", "c.email", "c.email"]);
  });

  it("refuses a bad pattern, queue or topic with exit 2 and the usage, before connecting; never a password", async () => {
    // Nothing listens on port 1: a refusal that connected first would say ECONNREFUSED, exit 1.
    const nowhere = "postgres://someone:s3cr3t-pw@127.0.0.1:1/db";
    const cases: [string[], RegExp][] = [
      [["subscribe", "c.order.**", "c.billing"], /TOPIC: "c\.order\.\*\*" is not a topic pattern/],
      [["subscribe", "c.order.*", "bad queue"], /QUEUE: "bad queue"/],
      [["unsubscribe", "a..b", "c.billing"], /TOPIC: "a\.\.b" is not a topic pattern/],
      [["subscribe", "c.order.*"], /needs a topic \(or pattern\) and a queue/],
      [["subscriptions", "--for", "c.order.*"], /--for: "c\.order\.\*" is not a topic name/],
      [["subscriptions", "--for", "c.x", "--queue", "q"], /--for cannot be combined/],
      [["subscriptions", "--topic", "#.#x"], /--topic: "#\.#x" is not a topic pattern/],
    ];
    for (const [args, error] of cases) {
      const result = await cli(args, nowhere);
      expect(result.code, args.join(" ")).toBe(2);
      expect(result.stderr, args.join(" ")).toMatch(error);
      expect(result.stderr, args.join(" ")).toContain("Usage: outbox-worker");
      expect(result.stdout + result.stderr).not.toContain("s3cr3t-pw");
    }
    const unreachable = await cli(["subscribe", "c.order.*", "c.billing"], nowhere);
    expect(unreachable.code).toBe(1);
    expect(unreachable.stdout + unreachable.stderr).not.toContain("s3cr3t-pw");
  });

  it("a role without the right is told which grant gives it; an inspector reads who receives what", async () => {
    const asWorker = await cli(["subscribe", "c.spy.#", "c.spy"], urlAs(role.worker));
    expect(asWorker.code).toBe(1);
    expect(asWorker.stderr).toMatch(/permission denied.*--worker-can-subscribe/);
    const asInspector = await cli(["unsubscribe", "c.order.placed", "c.email"], urlAs(role.inspector));
    expect(asInspector.code).toBe(1);
    expect(asInspector.stderr).toMatch(/permission denied.*schema's owner/);
    expect(asWorker.stderr + asInspector.stderr).not.toContain(ROLE_PASSWORD);
    const read = await cli(["subscriptions", "--for", "c.order.placed", "--json"], urlAs(role.inspector));
    expect(read, read.stderr).toMatchObject({ code: 0 });
    expect(JSON.parse(read.stdout).queues.map((q: { queue: string }) => q.queue)).toContain("c.email");
  });

  it("says what to run on a schema without the subscriptions table", async () => {
    const bare = db.freshSchema("bare");
    await db.pool.query(`CREATE SCHEMA "${bare}"`);
    const result = await runCli(["subscriptions", "--schema", bare], {
      PATH: process.env.PATH,
      DATABASE_URL: db.url,
    });
    expect(result.code).toBe(1);
    expect(result.stderr).toContain(`outbox-worker migrate --schema ${bare}`);
  });
});

describe("a worker queue's subscribe", () => {
  it("is applied at start before fetching; a second start changes nothing; removing a pattern unsubscribes nothing", async () => {
    const handled: { queue: string; topic: string | null }[] = [];
    const queues = (subscribe: string[]) => ({
      "w.billing": {
        handler: (_payload: unknown, m: { queue: string; topic: string | null }) => {
          handled.push({ queue: m.queue, topic: m.topic });
        },
        subscribe,
      },
      "w.plain": () => {},
    });
    const first = memoryLogger();
    const worker = await workers.start({
      queues: queues(["w.order.*", "w.order.#", "w.order.*"]),
      logger: first.logger,
    });
    const applied = await listSubscriptions(db.pool, { schema, queue: "w.billing" });
    expect(applied.map((s) => s.topic).sort()).toEqual(["w.order.#", "w.order.*"]);
    const created = (lines: typeof first.lines) =>
      lines.filter((l) => l.msg === "subscribed queue to topic").map((l) => [l.queue, l.topic]);
    expect(created(first.lines)).toEqual([
      ["w.billing", "w.order.*"],
      ["w.billing", "w.order.#"],
    ]);
    await publish("w.order.placed");
    await until(() => handled.length === 1, "the subscriber's copy handled");
    expect(handled).toEqual([{ queue: "w.billing", topic: "w.order.placed" }]);
    await worker.stop();

    // Another start (a restart, another replica), with one pattern gone from the list.
    const second = memoryLogger();
    await workers.start({ queues: queues(["w.order.*"]), logger: second.logger });
    expect(created(second.lines)).toEqual([]);
    expect(await listSubscriptions(db.pool, { schema, queue: "w.billing" })).toEqual(applied);
  });

  it("names the field of a bad pattern before anything connects", () => {
    const make = () =>
      createWorker({
        connection: "postgres://nobody@127.0.0.1:1/none",
        schema,
        logger: false,
        queues: { "w.bad": { handler: () => {}, subscribe: ["w.ok", "w..bad"] } },
      });
    expect(make).toThrow(OutboxConfigError);
    expect(make).toThrow(/queues\.w\.bad\.subscribe\[1\]: "w\.\.bad" is not a topic pattern/);
  });

  it("a role that may not subscribe: start is refused naming the grant option, and the worker is stopped", async () => {
    const options = {
      connection: urlAs(role.worker),
      schema,
      logger: false as const,
      queues: { "w.granted": { handler: () => {}, subscribe: ["w.granted.#"] } },
    };
    const refused = createWorker(options);
    const error = await refused.start().then(
      () => undefined,
      (e: Error & { code?: string }) => e,
    );
    expect(error?.message).toMatch(
      /cannot subscribe queue "w\.granted" to "w\.granted\.#" \(queues\.w\.granted\.subscribe\[0\]\): permission denied.*outbox-worker grant --worker <role> --worker-can-subscribe/,
    );
    expect(error?.code).toBe("42501");
    await expect(refused.wait()).rejects.toBe(error);
    expect(await refused.stop()).toEqual({ drained: true, released: 0, abandoned: [] });

    await grant(["--worker", role.worker, "--worker-can-subscribe"]);
    try {
      await workers.start(options);
      expect(await subscribersOf(db.pool, "w.granted.x", { schema })).toEqual(["w.granted"]);
      // A restart with the subscription there: the same statement, nothing new.
      await workers.start({ ...options, workerId: "second" });
    } finally {
      await grant(["--worker", role.worker]);
    }
  });
});

describe("the service's subscriptions", () => {
  let server: http.Server;
  let port: number;
  const received: { url: string; body: string; type: string | undefined }[] = [];

  beforeAll(async () => {
    server = http.createServer((req, res) => {
      let body = "";
      req.on("data", (chunk: Buffer) => {
        body += chunk.toString();
      });
      req.on("end", () => {
        received.push({ url: req.url ?? "", body, type: req.headers["ce-type"] as string | undefined });
        res.writeHead(204).end();
      });
    });
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    port = (server.address() as AddressInfo).port;
  });
  afterAll(async () => {
    server.closeAllConnections();
    await new Promise((resolve) => server.close(resolve));
  });

  const handlers = path.resolve("test/support/fixtures/topic-handlers.ts");
  const handled = () =>
    ((
      globalThis as { topicHandled?: { queue: string; topic: string | null; payload: unknown }[] }
    ).topicHandled ??= []);

  it("a relay subscribed to order.* gets an event once while a handler queue subscribed to it handles it too", async () => {
    const config = serviceConfigSchema.parse({
      databaseUrl: db.url,
      schema,
      handlers,
      relays: { hook: { type: "http", url: `http://127.0.0.1:${port}/hook`, subscribe: ["order.*"] } },
      subscriptions: { billing: ["order.placed"] },
      worker: { minPollIntervalMs: 20, maxPollIntervalMs: 200 },
    });
    const { logger, lines } = memoryLogger();
    const service = await startService(config, logger);
    try {
      const made = (await listSubscriptions(db.pool, { schema }))
        .filter((s) => !s.queue.includes("."))
        .map((s) => `${s.queue} ${s.topic}`);
      // The module's own subscribe and the config's for the same queue, and the relay's.
      expect(made.sort()).toEqual(["billing order.cancelled", "billing order.placed", "hook order.*"]);
      expect(lines.filter((l) => l.msg === "subscribed queue to topic")).toHaveLength(3);

      const event = await db.inTransaction((c) => outbox.publishToTopic(c, "order.placed", { order: 7 }));
      expect(event.messages.map((m) => m.queue)).toEqual(["billing", "hook"]);
      await until(() => received.length >= 1 && handled().length >= 1, "relay and handler got the event");
      await until(
        async () =>
          (await db.pool.query(`SELECT 1 FROM ${names.messages} WHERE queue IN ('billing', 'hook')`))
            .rowCount === 0,
        "both copies acknowledged",
      );
      expect(received).toEqual([{ url: "/hook", body: '{"order": 7}', type: "order.placed" }]);
      expect(handled()).toEqual([{ queue: "billing", topic: "order.placed", payload: { order: 7 } }]);
    } finally {
      await service.stop();
    }

    // Started again: every subscription is there already, so none is made (and none is logged).
    const again = memoryLogger();
    const restarted = await startService(config, again.logger);
    await restarted.stop();
    expect(again.lines.filter((l) => l.msg === "subscribed queue to topic")).toEqual([]);
  });

  it("refuses, before connecting, a subscription for a queue the service does not serve, naming the field", async () => {
    const config = serviceConfigSchema.parse({
      databaseUrl: "postgres://someone:pw@127.0.0.1:1/none",
      schema,
      relays: { hook: { type: "http", url: `http://127.0.0.1:${port}/hook` } },
      subscriptions: { hook: ["order.*"], ghost: ["order.*"] },
    });
    const error = await startService(config, memoryLogger().logger).then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(error).toBeInstanceOf(ConfigError);
    expect((error as ConfigError).problems).toEqual([
      expect.stringMatching(
        /^subscriptions\.ghost \(OUTBOX_SUBSCRIPTIONS\): queue "ghost" is not served here/,
      ),
    ]);

    // A handlers module's own subscribe is checked when the module loads, before anything connects.
    const dir = await testTempDir("subm-handlers-");
    const module = path.join(dir, "handlers.mjs");
    await writeFile(module, 'export default { billing: { handler() {}, subscribe: ["ok", "order.**"] } };\n');
    const loadError = await startService(
      serviceConfigSchema.parse({
        databaseUrl: "postgres://someone:pw@127.0.0.1:1/none",
        schema,
        handlers: module,
      }),
      memoryLogger().logger,
    ).then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(loadError).toBeInstanceOf(ConfigError);
    expect((loadError as ConfigError).problems).toEqual([
      expect.stringMatching(
        /^handlers \(OUTBOX_HANDLERS\): queue "billing" in .*: subscribe\[1\]: "order\.\*\*" is not a topic pattern/,
      ),
    ]);

    const run = await execCli(["run"], {
      DATABASE_URL: "postgres://someone:pw@127.0.0.1:1/none",
      OUTBOX_SCHEMA: schema,
      OUTBOX_RELAYS: JSON.stringify({ hook: { type: "http", url: `http://127.0.0.1:${port}/hook` } }),
      OUTBOX_SUBSCRIPTIONS: JSON.stringify({ ghost: ["order.*"] }),
    });
    expect(run.code).toBe(2);
    expect(run.stderr).toContain(
      'subscriptions.ghost (OUTBOX_SUBSCRIPTIONS): queue "ghost" is not served here',
    );
  });

  it("a worker role that may not subscribe: the start fails with one line naming the grant", async () => {
    const config = serviceConfigSchema.parse({
      databaseUrl: urlAs(role.worker),
      schema,
      relays: { hook2: { type: "http", url: `http://127.0.0.1:${port}/hook`, subscribe: ["order.#"] } },
    });
    const error = await startService(config, memoryLogger().logger).then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(error).toBeInstanceOf(StartupError);
    // Checked with the other rights, before anything is served: which right, and the grant that gives it.
    expect((error as Error).message).toMatch(
      /^permission denied: the worker's user \(\w+\) needs INSERT \(pattern, queue\) ON "\w+"\.subscriptions.*run `outbox-worker grant --worker \w+ --worker-can-subscribe/,
    );
    expect((error as Error).message).not.toContain(ROLE_PASSWORD);
  });
});
