import { writeFile } from "node:fs/promises";
import http from "node:http";
import type { AddressInfo } from "node:net";
import path from "node:path";
import amqp from "amqplib";
import { HTTP } from "cloudevents";
import { Redis } from "ioredis";
import { connect as natsConnect } from "nats";
import { Webhook } from "standardwebhooks";
import { afterEach, beforeAll, describe, expect, it } from "vitest";
import { HOST, NATS_PORT, probeBrokers, RABBIT_URL, REDIS_PORT } from "../support/brokers.js";
import { type CliProcess, serviceEnv, startCli } from "../support/cli-process.js";
import { testDatabase } from "../support/database.js";
import { docSection } from "../support/docs.js";
import { testTempDir } from "../support/temp-dir.js";
import { publisherFor, until } from "../support/worker.js";

// The relay example of docs/operate/relays/index.md, pasted as it is into relays.json and run by the CLI against this machine's
// default brokers: every relay must be ok and deliver. A relay whose target cannot exist must show in
// /relays and in the log, and leave /readyz ready.

const db = testDatabase("readme");
const outbox = publisherFor(db.schema);
const { redisDown, natsDown, rabbitDown } = await probeBrokers("docs-relays.test");
const brokersDown = [redisDown, natsDown, rabbitDown].filter((r) => r !== undefined);

beforeAll(() => db.migrate());
const running: CliProcess[] = [];
const cleanups: (() => Promise<unknown>)[] = [];
afterEach(async () => {
  for (const p of running.splice(0)) if (p.child.exitCode === null) p.child.kill("SIGKILL");
  for (const c of cleanups.splice(0).reverse()) await c().catch(() => {});
});

/** The first ```json block of the "Built-in relays" page, as text. */
async function readmeRelayExample(): Promise<string> {
  const section = docSection("docs/operate/relays/index.md", "# Built-in relays");
  const block = /```json\n([\s\S]*?)```/.exec(section)?.[1];
  if (block === undefined) throw new Error("no JSON example in the Built-in relays page");
  return block;
}

async function runService(configText: string): Promise<{ p: CliProcess; base: string }> {
  const dir = await testTempDir("outbox-docs-relays-");
  const file = path.join(dir, "relays.json");
  await writeFile(file, configText);
  const p = startCli(["run", "--config", file, "--http-port", "0"], serviceEnv(db));
  running.push(p);
  const listening = JSON.parse(await p.waitFor("http server listening"));
  await p.waitFor("outbox-worker running");
  return { p, base: `http://127.0.0.1:${listening.port}` };
}

interface Relays {
  ok: boolean;
  relays: Record<string, { state: string; error?: string; target: string }>;
}

async function relaysReport(base: string): Promise<Relays> {
  const response = await fetch(`${base}/relays`);
  expect(response.status).toBe(200);
  return (await response.json()) as Relays;
}

async function readyzStatus(base: string): Promise<number> {
  return (await fetch(`${base}/readyz`)).status;
}

describe.skipIf(brokersDown.length > 0)("the docs relay example", () => {
  it("runs as pasted against the default local brokers: ready, and every queue delivered", async () => {
    const example = await readmeRelayExample();
    const config = JSON.parse(example) as { relays: Record<string, Record<string, string>> };
    const webhook = new URL(config.relays["order.placed"]?.url ?? "");
    const secret = config.relays["order.placed"]?.signingSecret ?? "";

    // The webhook receiver the example points at; elsewhere if that port is taken on this machine.
    const received: { body: string; headers: http.IncomingHttpHeaders }[] = [];
    const receiver = http.createServer((req, res) => {
      let body = "";
      req.on("data", (chunk) => {
        body += chunk;
      });
      req.on("end", () => {
        received.push({ body, headers: req.headers });
        res.writeHead(204).end();
      });
    });
    let text = example;
    await new Promise<void>((resolve) => {
      receiver.once("error", () => {
        console.warn(`docs-relays.test: port ${webhook.port} is taken; the receiver listens elsewhere`);
        receiver.listen(0, HOST, () => {
          const moved = `http://${HOST}:${(receiver.address() as AddressInfo).port}${webhook.pathname}`;
          text = example.replace(webhook.toString(), moved);
          resolve();
        });
      });
      receiver.listen(Number(webhook.port), webhook.hostname, resolve);
    });
    cleanups.push(() => new Promise((resolve) => receiver.close(resolve)));

    const { base } = await runService(text);
    expect(await relaysReport(base)).toMatchObject({
      ok: true,
      relays: Object.fromEntries(
        Object.keys(config.relays).map((q) => [q, expect.objectContaining({ state: "ok" })]),
      ),
    });
    expect(await readyzStatus(base)).toBe(200);

    // Ids unique across runs: NATS drops a Nats-Msg-Id it saw within its duplicate window (2 minutes), and
    // every fresh schema would start again at 1, so a rerun would read the previous run's message.
    await db.pool.query(`ALTER TABLE ${db.names.messages} ALTER COLUMN id RESTART WITH ${Date.now()}`);
    const ids: Record<string, string> = {};
    const payloads: Record<string, unknown> = {};
    await db.inTransaction(async (c) => {
      for (const queue of Object.keys(config.relays)) {
        payloads[queue] = { queue, at: Date.now() };
        ids[queue] = await outbox.publish(c, queue, payloads[queue]);
      }
    });
    // The service names the source after the database and schema.
    const source = expect.stringMatching(new RegExp(`^/outbox/[^/]+/${db.schema}$`));
    await until(async () => {
      const { rows } = await db.pool.query(`SELECT count(*)::int AS n FROM ${db.names.messages}`);
      return rows[0].n === 0;
    }, "every message delivered");
    const { rows: dead } = await db.pool.query(`SELECT queue, error FROM ${db.names.deadLetters}`);
    expect(dead).toEqual([]);

    // Each broker has it, as a CloudEvent: the webhook (signed), the NATS stream, the RabbitMQ queue, the
    // Redis stream.
    const hook = received.find((r) => r.headers["ce-id"] === ids["order.placed"]);
    if (hook === undefined) throw new Error("the webhook never got order.placed");
    expect(() => new Webhook(secret).verify(hook.body, hook.headers as Record<string, string>)).not.toThrow();
    expect(HTTP.toEvent({ headers: hook.headers, body: hook.body })).toMatchObject({
      id: ids["order.placed"],
      type: "order.placed",
      source,
      data: payloads["order.placed"],
    });

    const nc = await natsConnect({ servers: `${HOST}:${NATS_PORT}` });
    try {
      const jsm = await nc.jetstreamManager();
      const stream = config.relays["order.shipped"]?.stream ?? "";
      const message = await jsm.streams.getMessage(stream, { last_by_subj: "orders.shipped" });
      expect(message.header.get("Nats-Msg-Id")).toBe(ids["order.shipped"]);
      expect(message.header.get("ce-id")).toBe(ids["order.shipped"]);
      expect(message.header.get("ce-type")).toBe("order.shipped");
      expect(message.header.get("ce-source")).toEqual(source);
      expect(message.header.get("ce-datacontenttype")).toBe("application/json");
      expect(JSON.parse(message.string())).toEqual(payloads["order.shipped"]);
    } finally {
      await nc.close();
    }

    const model = await amqp.connect(RABBIT_URL);
    try {
      const channel = await model.createChannel();
      const queue = config.relays["invoice.due"]?.declareQueue ?? "";
      const seen = new Map<string, amqp.GetMessage>();
      for (
        let m = await channel.get(queue, { noAck: true });
        m !== false;
        m = await channel.get(queue, { noAck: true })
      ) {
        seen.set(String(m.properties.messageId), m);
      }
      const m = seen.get(ids["invoice.due"] ?? "");
      expect(m?.properties).toMatchObject({ type: "invoice.due", contentType: "application/json" });
      expect(m?.properties.headers).toMatchObject({
        "ce-id": ids["invoice.due"],
        "ce-type": "invoice.due",
        "ce-source": source,
      });
      expect(JSON.parse(m?.content.toString("utf8") ?? "")).toEqual(payloads["invoice.due"]);
    } finally {
      await model.close();
    }

    const redis = new Redis({ host: HOST, port: REDIS_PORT });
    try {
      const [[, fields] = ["", []]] = await redis.xrevrange(
        config.relays.audit?.stream ?? "",
        "+",
        "-",
        "COUNT",
        1,
      );
      expect(fields.slice(0, 4)).toEqual(["id", ids.audit, "type", "audit"]);
      expect(fields.at(-2)).toBe("event");
      expect(JSON.parse(fields.at(-1) ?? "")).toMatchObject({
        specversion: "1.0",
        id: ids.audit,
        source,
        data: payloads.audit,
      });
    } finally {
      redis.disconnect();
    }
  });

  it("shows a relay whose target cannot exist in /relays and in the log, and stays ready", async () => {
    const run = `${Date.now().toString(36)}${process.pid.toString(36)}`;
    const config = {
      relays: {
        "order.shipped": { type: "nats", subject: `outbox-readme.${run}.nostream` },
        "invoice.due": {
          type: "rabbitmq",
          exchange: `outbox-readme.${run}.missing`,
          routingKey: "invoice.due",
        },
      },
    };
    const { p, base } = await runService(JSON.stringify(config));
    const body = await relaysReport(base);
    expect(body.ok).toBe(false);
    expect(body.relays["order.shipped"]).toMatchObject({
      state: "misconfigured",
      error: expect.stringContaining(`no JetStream stream captures subject outbox-readme.${run}.nostream`),
    });
    expect(body.relays["invoice.due"]).toMatchObject({
      state: "misconfigured",
      error: expect.stringContaining(`exchange "outbox-readme.${run}.missing" does not exist`),
    });
    // A broker's missing target is no reason to take the worker out of rotation: its messages retry.
    await expect.poll(() => readyzStatus(base)).toBe(200);
    const errors = p
      .output()
      .split("\n")
      .filter((l) => l.startsWith("{"))
      .map((l) => JSON.parse(l) as { level: number; msg: string; queue?: string; problem?: string })
      .filter((l) => l.level === 50);
    expect(errors.map((l) => [l.queue, l.msg])).toEqual(
      expect.arrayContaining([
        ["order.shipped", "nats relay target unusable; messages retry until it is fixed"],
        ["invoice.due", "rabbitmq relay target unusable; messages retry until it is fixed"],
      ]),
    );
  });
});
