import { readdir, readFile, writeFile } from "node:fs/promises";
import http from "node:http";
import type { AddressInfo } from "node:net";
import path from "node:path";
import { pathToFileURL } from "node:url";
import { Parser } from "@asyncapi/parser";
import { compileFromFile } from "json-schema-to-typescript";
import { describe, expect, it } from "vitest";
import { parse as parseYaml } from "yaml";
import { queueSchemaDocument } from "../../src/describe/json-schema.js";
import { createHttpRelay } from "../../src/relay/http.js";
import { runCli } from "../support/cli-in-process.js";
import { FETCH_OWN_HEADERS, fakeMessage } from "../support/message.js";
import { testTempDir } from "../support/temp-dir.js";

// The `asyncapi` and `schemas` commands as a user runs them (in-process CLI): valid AsyncAPI 3.0 per the
// reference parser, with and without a relay config, following the queue schemas, free of credentials.

const ROOT = path.resolve(import.meta.dirname, "../..");
const ZOD = pathToFileURL(path.join(ROOT, "node_modules/zod/index.js")).href;
const QUEUE = pathToFileURL(path.join(ROOT, "src/produce/queue.ts")).href;
const TOPIC = pathToFileURL(path.join(ROOT, "src/produce/topic.ts")).href;
const DEMO_QUEUES = path.join(ROOT, "examples/consumers/queues.ts");

/** A queues module in a temp folder; a new file each time, so no import cache hides a change. */
async function queuesModule(dir: string, name: string, body: string): Promise<string> {
  const file = path.join(dir, `${name}.mjs`);
  await writeFile(
    file,
    `import { z } from ${JSON.stringify(ZOD)};\nimport { defineQueue } from ${JSON.stringify(QUEUE)};\nimport { defineTopic, subscriberQueue } from ${JSON.stringify(TOPIC)};\n${body}\n`,
  );
  return file;
}

const ORDERS = `export const orderPlaced = defineQueue("order.placed", z.object({ orderId: z.number().int(), customer: z.string() }));
export const billing = [defineQueue("billing/invoice:created", z.object({ invoice: z.string(), cents: z.number().int() })), defineQueue("audit")];`;

// Credentials in every place a relay config can hold one: none may reach the document.
const SECRETS = {
  urlToken: "tok-in-query-1a2b3c",
  amqpPassword: "amqp-pw-4d5e6f",
  natsToken: "nats-token-7a8b9c",
  redisPassword: "redis-pw-0d1e2f",
  authorization: "Bearer header-secret-3a4b5c",
  signingSecret: `whsec_${Buffer.alloc(32, 9).toString("base64")}`,
};

const RELAYS = {
  relays: {
    "order.placed": {
      type: "http",
      url: `https://hooks.example.com/in/orders?token=${SECRETS.urlToken}`,
      signingSecret: SECRETS.signingSecret,
      headers: { authorization: SECRETS.authorization },
    },
    "billing/invoice:created": {
      type: "rabbitmq",
      url: `amqp://app:${SECRETS.amqpPassword}@rabbit.internal:5672/billing`,
      exchange: "events",
      exchangeType: "topic",
      routingKey: "outbox.{queue}",
    },
    audit: {
      type: "nats",
      servers: [`nats://${SECRETS.natsToken}@nats.internal:4222`],
      subject: "outbox.{queue}",
      stream: "OUTBOX",
    },
    "relayed.only": {
      type: "redis",
      url: `redis://:${SECRETS.redisPassword}@redis.internal:6379/0`,
      stream: "outbox:{queue}",
    },
  },
};

/** The parser's errors (severity 0), as text for the failure message. */
async function asyncapiErrors(text: string): Promise<string[]> {
  const diagnostics = await new Parser().validate(text);
  return diagnostics
    .filter((d) => d.severity === 0)
    .map((d) => `${d.code}: ${d.message} at ${d.path.join(".")}`);
}

type Doc = {
  servers?: Record<string, { host: string; protocol: string }>;
  channels: Record<
    string,
    { address: string; title: string; servers?: unknown[]; bindings?: Record<string, unknown> }
  >;
  operations: Record<
    string,
    {
      action: string;
      channel: { $ref: string };
      messages: { $ref: string }[];
      "x-outbox-queue"?: string;
      "x-outbox-subscriptions"?: string[];
    }
  >;
  info: { description: string };
  components: {
    schemas: Record<string, { properties?: Record<string, unknown>; required?: string[] }>;
    messages: Record<
      string,
      { headers?: { properties: Record<string, { const?: string }>; required: string[] }; payload: unknown }
    >;
  };
};

function channelOf(doc: Doc, queue: string) {
  const entry = Object.entries(doc.channels).find(([, c]) => c.title === queue);
  if (entry === undefined) throw new Error(`no channel for ${queue}`);
  const [id, channel] = entry;
  return { id, channel, schema: doc.components.schemas[id], message: doc.components.messages[id] };
}

/** A topic's channel (its title is `<topic> (topic)`), its schema, and its operations by action. */
function topicOf(doc: Doc, topic: string) {
  const { id, channel, schema, message } = channelOf(doc, `${topic} (topic)`);
  const operations = Object.values(doc.operations).filter((o) => o.channel.$ref === `#/channels/${id}`);
  return {
    id,
    channel,
    schema,
    message,
    sends: operations.filter((o) => o.action === "send"),
    receivers: operations.filter((o) => o.action === "receive").map((o) => o["x-outbox-queue"]),
    receives: operations.filter((o) => o.action === "receive"),
  };
}

// Topics beside queues: a subscriber queue made from a topic, subscriptions in a handlers map's entries
// (QueueConfig.subscribe) and in a `subscriptions` export, a pattern matching two topics, one matching none.
const TOPICS = `export const placed = defineTopic("order.placed", z.object({ orderId: z.number().int(), customer: z.string() }));
export const topics = [defineTopic("order.cancelled", z.object({ orderId: z.number().int(), reason: z.string() })), defineTopic("payment.failed")];
export const order = defineQueue("order.placed", z.object({ legacy: z.boolean() }));
export const billing = subscriberQueue(placed, "billing");
export default { billing: { handler: () => {}, schema: billing.schema, subscribe: ["order.placed"] }, email: { handler: () => {}, subscribe: ["order.*"] } };
export const subscriptions = { search: ["#"], refunds: ["refund.#"], email: ["order.placed"] };`;

async function asyncapi(args: string[]) {
  return runCli(["asyncapi", ...args], { PATH: process.env.PATH });
}

describe("outbox-worker asyncapi", () => {
  it("prints valid AsyncAPI 3.0 YAML without a config: one channel and send operation per queue, payload schemas", async () => {
    const dir = await testTempDir("outbox-asyncapi-");
    const { code, stdout, stderr } = await asyncapi(["--queues", await queuesModule(dir, "q", ORDERS)]);
    expect(stderr).toBe("");
    expect(code).toBe(0);
    expect(await asyncapiErrors(stdout)).toEqual([]);
    // YAML, not JSON (which a YAML parser would read too).
    expect(stdout).toMatch(/^asyncapi: 3\.0\.0\ninfo:\n/);
    const doc = parseYaml(stdout) as Doc & { asyncapi: string };
    expect(doc.asyncapi).toBe("3.0.0");
    expect(doc.servers).toBeUndefined();
    expect(Object.values(doc.channels).map((c) => c.title)).toEqual([
      "order.placed",
      "billing/invoice:created",
      "audit",
    ]);
    expect(Object.values(doc.operations).map((o) => o.action)).toEqual(["send", "send", "send"]);
    const order = channelOf(doc, "order.placed");
    expect(order.channel.servers).toBeUndefined();
    expect(order.channel.bindings).toBeUndefined();
    expect(order.schema).toMatchObject({
      type: "object",
      properties: { orderId: { type: "integer" }, customer: { type: "string" } },
      required: ["orderId", "customer"],
    });
    // A queue without a schema: any JSON value.
    expect(channelOf(doc, "audit").schema).toEqual({ title: "audit" });
  });

  it("a recursive or shared payload schema: its definitions become components, and every $ref resolves in the document", async () => {
    // zod writes a recursive schema, or one given an id, once under the payload's own `definitions` and
    // refers to it as `#/definitions/…`; inside the AsyncAPI document such a ref resolves from the root.
    const dir = await testTempDir("outbox-asyncapi-");
    const body = `const Category = z.object({ name: z.string(), get children() { return z.array(Category); } });
const Money = z.object({ cents: z.number().int(), currency: z.string() }).meta({ id: "Money" });
export const tree = defineQueue("tree.changed", z.object({ root: Category }));
export const paid = defineQueue("order/paid", z.object({ total: Money, tip: Money }));`;
    const { code, stdout, stderr } = await asyncapi([
      "--queues",
      await queuesModule(dir, "defs", body),
      "--format",
      "json",
    ]);
    expect(stderr).toBe("");
    expect(code).toBe(0);
    expect(await asyncapiErrors(stdout)).toEqual([]);
    const doc = JSON.parse(stdout) as Doc;
    const refs: string[] = [];
    (function collect(node: unknown): void {
      if (Array.isArray(node)) node.forEach(collect);
      else if (node !== null && typeof node === "object") {
        for (const [k, v] of Object.entries(node)) {
          if (k === "$ref" && typeof v === "string") refs.push(v);
          else collect(v);
        }
      }
    })(doc);
    const resolve = (ref: string) =>
      ref
        .slice(2)
        .split("/")
        .map((p) => p.replaceAll("~1", "/").replaceAll("~0", "~"))
        .reduce<unknown>((at, p) => (at as Record<string, unknown> | undefined)?.[p], doc);
    expect(refs.filter((r) => !r.startsWith("#/") || resolve(r) === undefined)).toEqual([]);
    expect(JSON.stringify(doc.components.schemas)).not.toMatch(/"(definitions|\$defs)"/);
    // The recursion goes through a component that refers to itself; both uses of Money share one.
    const tree = channelOf(doc, "tree.changed").schema as { properties: { root: { $ref: string } } };
    const category = resolve(tree.properties.root.$ref) as {
      properties: { children: { items: { $ref: string } } };
    };
    expect(category.properties.children.items.$ref).toBe(tree.properties.root.$ref);
    // Named after the property that holds it (zod calls it __schema0), or its id.
    expect(tree.properties.root.$ref).toMatch(/^#\/components\/schemas\/tree\.changed\.root$/);
    const paid = channelOf(doc, "order/paid").schema as { properties: Record<string, { $ref: string }> };
    expect(paid.properties.total?.$ref).toBe(paid.properties.tip?.$ref);
    expect(resolve(paid.properties.total?.$ref ?? "")).toMatchObject({ required: ["cents", "currency"] });
    expect(paid.properties.total?.$ref).toMatch(/\.Money$/);
  });

  it("topics: a channel each (address the topic), one send, one receive per subscribed queue; valid", async () => {
    const dir = await testTempDir("outbox-asyncapi-");
    const { code, stdout, stderr } = await asyncapi(["--queues", await queuesModule(dir, "t", TOPICS)]);
    expect(stderr).toBe("");
    expect(code).toBe(0);
    expect(await asyncapiErrors(stdout)).toEqual([]);
    const doc = parseYaml(stdout) as Doc;

    const placed = topicOf(doc, "order.placed");
    expect(placed.channel.address).toBe("order.placed");
    expect(placed.schema).toMatchObject({
      title: "order.placed",
      properties: { orderId: { type: "integer" }, customer: { type: "string" } },
      required: ["orderId", "customer"],
    });
    expect(placed.message?.payload).toEqual({ $ref: `#/components/schemas/${placed.id}` });
    expect(placed.sends).toHaveLength(1);
    // Exact name (billing), a pattern (email: order.* and order.placed: one receive), everything (search).
    expect(placed.receivers).toEqual(["billing", "email", "search"]);
    expect(placed.receives.find((o) => o["x-outbox-queue"] === "email")?.["x-outbox-subscriptions"]).toEqual([
      "order.*",
      "order.placed",
    ]);
    for (const op of [...placed.sends, ...placed.receives])
      expect(op.messages).toEqual([{ $ref: `#/channels/${placed.id}/messages/${placed.id}` }]);

    expect(topicOf(doc, "order.cancelled").receivers).toEqual(["email", "search"]);
    const failed = topicOf(doc, "payment.failed");
    expect(failed.receivers).toEqual(["search"]);
    expect(failed.schema).toEqual({ title: "payment.failed" });
    // A pattern that matches no topic here is said so, once.
    expect(doc.info.description).toContain(
      'match no topic defined here (their events are not described): "refund.#" (queue refunds)',
    );

    // The queues keep their channels as before: the queue order.placed beside the topic order.placed.
    expect(
      Object.values(doc.channels)
        .map((c) => c.title)
        .sort(),
    ).toEqual([
      "billing",
      "email",
      "order.cancelled (topic)",
      "order.placed",
      "order.placed (topic)",
      "payment.failed (topic)",
    ]);
    expect(channelOf(doc, "order.placed").schema?.properties).toHaveProperty("legacy");
    // The subscriber queue's payload is the topic's schema.
    const { title: _, ...billingSchema } = channelOf(doc, "billing").schema as Record<string, unknown>;
    const { title: __, ...placedSchema } = placed.schema as Record<string, unknown>;
    expect(billingSchema).toEqual(placedSchema);
  });

  it("topics without any declared subscriber: a send and no receive, and the channel says where subscribers live", async () => {
    const dir = await testTempDir("outbox-asyncapi-");
    const { code, stdout } = await asyncapi([
      "--queues",
      await queuesModule(dir, "lone", 'export const t = defineTopic("audit.logged");'),
      "--format",
      "json",
    ]);
    expect(code).toBe(0);
    expect(await asyncapiErrors(stdout)).toEqual([]);
    const doc = JSON.parse(stdout) as Doc & { channels: Record<string, { description: string }> };
    const logged = topicOf(doc, "audit.logged");
    expect(logged.sends).toHaveLength(1);
    expect(logged.receives).toEqual([]);
    expect((logged.channel as { description?: string }).description).toContain(
      "No subscription to it is declared here (the database may hold others: outbox-worker subscriptions)",
    );
  });

  it("prints JSON with --format json, and the title and version asked for", async () => {
    const dir = await testTempDir("outbox-asyncapi-");
    const { code, stdout } = await asyncapi([
      "--queues",
      await queuesModule(dir, "q", ORDERS),
      "--format",
      "json",
      "--title",
      "Shop events",
      "--version",
      "2.1.0",
    ]);
    expect(code).toBe(0);
    expect(stdout.startsWith("{\n")).toBe(true);
    const doc = JSON.parse(stdout) as { info: { title: string; version: string } };
    expect(doc.info).toMatchObject({ title: "Shop events", version: "2.1.0" });
    expect(await asyncapiErrors(stdout)).toEqual([]);
    const bad = await asyncapi(["--queues", await queuesModule(dir, "r", ORDERS), "--format", "xml"]);
    expect(bad.code).toBe(2);
    expect(bad.stderr).toContain('--format must be yaml or json, got "xml"');
  });

  it("follows a schema change: a field added to a queue's zod schema shows in its payload", async () => {
    const dir = await testTempDir("outbox-asyncapi-");
    const before = await asyncapi(["--queues", await queuesModule(dir, "v1", ORDERS)]);
    const changed = ORDERS.replace(
      "customer: z.string() }",
      "customer: z.string(), coupon: z.string().max(20) }",
    );
    expect(changed).not.toBe(ORDERS);
    const after = await asyncapi(["--queues", await queuesModule(dir, "v2", changed)]);
    const schemaOf = (text: string) => channelOf(parseYaml(text) as Doc, "order.placed").schema;
    expect(schemaOf(before.stdout)?.properties).not.toHaveProperty("coupon");
    expect(schemaOf(after.stdout)?.properties).toHaveProperty("coupon", { type: "string", maxLength: 20 });
    expect(await asyncapiErrors(after.stdout)).toEqual([]);
  });

  it("with --config: the relays' addresses, servers, headers and bindings; valid; no credential anywhere", async () => {
    const dir = await testTempDir("outbox-asyncapi-");
    const config = path.join(dir, "outbox.config.json");
    await writeFile(
      config,
      JSON.stringify({ databaseUrl: "postgres://u:db-pw-9z8y@db.internal/shop", ...RELAYS }),
    );
    const { code, stdout, stderr } = await asyncapi([
      "--queues",
      await queuesModule(dir, "q", ORDERS),
      "--config",
      config,
    ]);
    expect(stderr).toBe("");
    expect(code).toBe(0);
    expect(await asyncapiErrors(stdout)).toEqual([]);
    for (const secret of [...Object.values(SECRETS), "db-pw-9z8y", "whsec_", "Bearer"]) {
      expect(stdout, `the output holds ${secret}`).not.toContain(secret);
    }
    const json = await asyncapi([
      "--queues",
      await queuesModule(dir, "r", ORDERS),
      "--config",
      config,
      "--format",
      "json",
    ]);
    for (const secret of Object.values(SECRETS)) expect(json.stdout).not.toContain(secret);

    const doc = parseYaml(stdout) as Doc;
    expect(Object.values(doc.servers ?? {})).toEqual([
      { host: "hooks.example.com", protocol: "https" },
      { host: "rabbit.internal:5672", protocol: "amqp" },
      { host: "nats.internal:4222", protocol: "nats" },
      { host: "redis.internal:6379", protocol: "redis" },
    ]);

    const order = channelOf(doc, "order.placed");
    expect(order.channel.address).toBe("/in/orders");
    const headers = order.message?.headers;
    expect(headers?.required).toEqual(
      expect.arrayContaining([
        "ce-id",
        "ce-source",
        "ce-type",
        "ce-specversion",
        "ce-time",
        "idempotency-key",
        "webhook-id",
        "webhook-timestamp",
        "webhook-signature",
        "authorization",
      ]),
    );
    expect(Object.keys(headers?.properties ?? {})).toEqual(
      expect.arrayContaining(["ce-subject", "traceparent", "ce-traceparent"]),
    );
    expect(headers?.required).not.toContain("ce-subject");
    expect(headers?.properties["ce-type"]?.const).toBe("order.placed");
    expect(headers?.properties["ce-source"]?.const).toBe("/outbox/shop/outbox");

    const invoice = channelOf(doc, "billing/invoice:created");
    expect(invoice.channel.address).toBe("outbox.billing/invoice:created");
    expect(invoice.channel.bindings).toMatchObject({
      amqp: { is: "routingKey", exchange: { name: "events", type: "topic", vhost: "billing" } },
    });
    expect(invoice.message?.headers?.properties).not.toHaveProperty("ce-datacontenttype");

    const audit = channelOf(doc, "audit");
    expect(audit.channel.address).toBe("outbox.audit");
    expect(audit.message?.headers?.required).toEqual(
      expect.arrayContaining(["ce-datacontenttype", "Nats-Msg-Id"]),
    );

    // Relayed but not in the module: a channel all the same, any JSON, the event wrapped in structured mode.
    const only = channelOf(doc, "relayed.only");
    expect(only.channel.address).toBe("outbox:relayed.only");
    expect(only.message?.headers?.required).toEqual(["id", "type"]);
    expect(only.message?.payload).toMatchObject({
      properties: { id: { type: "string" }, data: { $ref: `#/components/schemas/${only.id}` } },
    });
  });

  it("lists exactly the headers the http relay sends", async () => {
    const received: http.IncomingHttpHeaders[] = [];
    const server = http.createServer((req, res) => {
      received.push(req.headers);
      req.resume().on("end", () => res.writeHead(204).end());
    });
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    try {
      const port = (server.address() as AddressInfo).port;
      const relay = {
        type: "http",
        url: `http://127.0.0.1:${port}/hook`,
        signingSecret: SECRETS.signingSecret,
        headers: { authorization: "Bearer x" },
      } as const;
      const dir = await testTempDir("outbox-asyncapi-");
      const config = path.join(dir, "c.json");
      await writeFile(config, JSON.stringify({ relays: { "order.placed": relay } }));
      const { stdout } = await asyncapi([
        "--queues",
        await queuesModule(dir, "q", ORDERS),
        "--config",
        config,
        "--format",
        "json",
      ]);
      const headers = channelOf(JSON.parse(stdout) as Doc, "order.placed").message?.headers;

      const { pino } = await import("pino");
      const sent = await createHttpRelay(relay, { logger: pino({ enabled: false }) });
      for (const key of [null, "customer 1"]) {
        await sent.handler(
          null,
          fakeMessage({
            id: "42",
            queue: "order.placed",
            key,
            headers:
              key === null
                ? {}
                : {
                    traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
                    tracestate: "a=b",
                  },
            rawPayload: '{"orderId":1,"customer":"c"}',
          }),
        );
      }
      await sent.close();
      // What fetch adds by itself is not the relay's.
      const [keyless, full] = received.map((h) =>
        Object.keys(h)
          .filter((n) => !FETCH_OWN_HEADERS.has(n))
          .sort(),
      );
      expect(keyless).toEqual([...(headers?.required ?? [])].sort());
      expect(full).toEqual(Object.keys(headers?.properties ?? {}).sort());
    } finally {
      server.close();
    }
  });

  it("describes the demo's queues (examples/consumers/queues.ts), with each example relay config", async () => {
    const plain = await asyncapi(["--queues", DEMO_QUEUES]);
    expect(plain.code).toBe(0);
    expect(await asyncapiErrors(plain.stdout)).toEqual([]);
    expect(channelOf(parseYaml(plain.stdout) as Doc, "order.placed").schema?.required).toEqual([
      "orderId",
      "customer",
      "totalCents",
    ]);
    const configs = path.join(ROOT, "examples/consumers/config");
    for (const file of await readdir(configs)) {
      const out = await asyncapi(["--queues", DEMO_QUEUES, "--config", path.join(configs, file)]);
      expect(out.stderr, file).toBe("");
      expect(await asyncapiErrors(out.stdout), file).toEqual([]);
    }
  });

  it("says clearly what is wrong with --queues", async () => {
    const dir = await testTempDir("outbox-asyncapi-");
    const missing = await asyncapi(["--queues", path.join(dir, "nope.js")]);
    expect(missing.code).toBe(2);
    expect(missing.stderr).toMatch(/outbox-worker asyncapi: invalid --queues: cannot load .*nope\.js/);
    const empty = await asyncapi(["--queues", await queuesModule(dir, "empty", "export const answer = 42;")]);
    expect(empty.code).toBe(2);
    expect(empty.stderr).toMatch(/empty\.mjs exports no queue or topic definitions/);
    const dated = await asyncapi([
      "--queues",
      await queuesModule(dir, "dated", 'export const q = defineQueue("when", z.object({ at: z.date() }));'),
    ]);
    expect(dated.code).toBe(2);
    expect(dated.stderr).toMatch(
      /queue "when": its zod schema cannot be written as JSON Schema: Date cannot be represented/,
    );
    const none = await asyncapi([]);
    expect(none.code).toBe(2);
    expect(none.stderr).toContain("--queues MODULE is required");
  });

  it("refuses a bad --config listing its problems", async () => {
    const dir = await testTempDir("outbox-asyncapi-");
    const config = path.join(dir, "bad.json");
    await writeFile(config, JSON.stringify({ relays: { q: { type: "nats", subject: "a b" } } }));
    const out = await asyncapi(["--queues", await queuesModule(dir, "q", ORDERS), "--config", config]);
    expect(out.code).toBe(2);
    expect(out.stderr).toContain("relays.q.subject");
  });
});

describe("outbox-worker asyncapi --config: the config's subscriptions", () => {
  it("a relay's own subscribe and the config's subscriptions add receive operations to the matching topics", async () => {
    const dir = await testTempDir("outbox-asyncapi-");
    const config = path.join(dir, "outbox.config.json");
    await writeFile(
      config,
      JSON.stringify({
        relays: {
          webhook: { type: "http", url: "https://hooks.example.com/orders", subscribe: ["order.#"] },
        },
        subscriptions: { billing: ["order.placed"], ledger: ["payment.*"] },
      }),
    );
    const module = await queuesModule(
      dir,
      "c",
      `export const topics = [defineTopic("order.placed", z.object({ orderId: z.number().int() })), defineTopic("order.refund.issued")];
export const billing = defineQueue("billing");`,
    );
    const { code, stdout, stderr } = await asyncapi(["--queues", module, "--config", config]);
    expect(stderr).toBe("");
    expect(code).toBe(0);
    expect(await asyncapiErrors(stdout)).toEqual([]);
    const doc = parseYaml(stdout) as Doc;
    expect(topicOf(doc, "order.placed").receivers).toEqual(["billing", "webhook"]);
    // order.# takes any number of segments; nothing else subscribes to the refund.
    expect(topicOf(doc, "order.refund.issued").receivers).toEqual(["webhook"]);
    expect(doc.info.description).toContain('"payment.*" (queue ledger)');
    // The relayed queue keeps its relay's channel; its copies are typed by their topic: no one ce-type.
    const webhook = channelOf(doc, "webhook");
    expect(webhook.channel.address).toBe("/orders");
    const headers = webhook.message?.headers as
      | { properties: Record<string, { const?: string }> }
      | undefined;
    expect(headers?.properties["ce-type"]).toBeDefined();
    expect(headers?.properties["ce-type"]?.const).toBeUndefined();
  });
});

describe("outbox-worker schemas", () => {
  it("writes each topic's schema to <topic>.topic.json, and a subscriber queue refers to it", async () => {
    const dir = await testTempDir("outbox-schemas-");
    const out = path.join(dir, "schemas");
    const { code, stdout, stderr } = await runCli(
      ["schemas", "--queues", await queuesModule(dir, "t", TOPICS), "--out", out],
      {},
    );
    expect(stderr).toBe("");
    expect(code).toBe(0);
    expect((await readdir(out)).sort()).toEqual([
      "billing.schema.json",
      "email.schema.json",
      "order.cancelled.topic.json",
      "order.placed.schema.json",
      "order.placed.topic.json",
      "payment.failed.topic.json",
    ]);
    expect(stdout).toContain(`topic order.placed → ${path.join(out, "order.placed.topic.json")}`);
    const read = async (file: string) => JSON.parse(await readFile(path.join(out, file), "utf8"));
    const topic = await read("order.placed.topic.json");
    expect(topic).toMatchObject({
      $schema: "https://json-schema.org/draft/2020-12/schema",
      $id: "order.placed.topic.json",
      title: "order.placed",
      properties: { orderId: { type: "integer" }, customer: { type: "string" } },
    });
    // The subscriber queue made with subscriberQueue(placed, "billing") shares it by reference ...
    const billing = await read("billing.schema.json");
    expect(billing).toMatchObject({ $id: "billing.schema.json", $ref: "order.placed.topic.json" });
    expect(billing).not.toHaveProperty("properties");
    // ... which a code generator follows from the file: the queue's type has the topic's fields.
    const types = await compileFromFile(path.join(out, "billing.schema.json"), {
      cwd: out,
      bannerComment: "",
    });
    expect(types).toMatch(/orderId: number;/);
    expect(types).toMatch(/customer: string;/);
    // The queue named like the topic keeps its own schema and file.
    expect(await read("order.placed.schema.json")).toMatchObject({
      properties: { legacy: { type: "boolean" } },
    });
  });

  it("writes one 2020-12 JSON Schema per queue, file names safe for / and :", async () => {
    const dir = await testTempDir("outbox-schemas-");
    const out = path.join(dir, "schemas");
    const { code, stdout, stderr } = await runCli(
      ["schemas", "--queues", await queuesModule(dir, "q", ORDERS), "--out", out],
      {},
    );
    expect(stderr).toBe("");
    expect(code).toBe(0);
    expect((await readdir(out)).sort()).toEqual([
      "audit.schema.json",
      "billing%2Finvoice%3Acreated.schema.json",
      "order.placed.schema.json",
    ]);
    expect(stdout).toContain(
      `billing/invoice:created → ${path.join(out, "billing%2Finvoice%3Acreated.schema.json")}`,
    );
    const written = JSON.parse(
      await readFile(path.join(out, "billing%2Finvoice%3Acreated.schema.json"), "utf8"),
    );
    expect(written).toMatchObject({
      $schema: "https://json-schema.org/draft/2020-12/schema",
      title: "billing/invoice:created",
      properties: { invoice: { type: "string" }, cents: { type: "integer" } },
    });
    // The same schema the AsyncAPI document carries (draft-07 there: the same for such a schema).
    const doc = parseYaml((await asyncapi(["--queues", await queuesModule(dir, "r", ORDERS)])).stdout) as Doc;
    const { $schema: _, $id: __, description: ___, ...fileSchema } = written;
    expect(channelOf(doc, "billing/invoice:created").schema).toEqual(fileSchema);
  });

  it("needs --queues and --out, and writes nothing for a schema it cannot express", async () => {
    const dir = await testTempDir("outbox-schemas-");
    expect((await runCli(["schemas", "--out", dir], {})).stderr).toContain("--queues MODULE is required");
    const module = await queuesModule(
      dir,
      "q",
      `export const a = defineQueue("a", z.object({}));\nexport const b = defineQueue("b", z.object({ at: z.date() }));`,
    );
    const out = path.join(dir, "out");
    const result = await runCli(["schemas", "--queues", module, "--out", out], {});
    expect(result.code).toBe(2);
    expect(result.stderr).toContain('queue "b"');
    await expect(readdir(out)).rejects.toThrow(/ENOENT/);
  });
});

describe("queueSchemaDocument of the demo queue", () => {
  it("is what examples/consumers/schemas holds", async () => {
    const { orderPlaced } = await import("../../examples/consumers/queues.js");
    const file = JSON.parse(
      await readFile(path.join(ROOT, "examples/consumers/schemas/order.placed.schema.json"), "utf8"),
    );
    expect(file).toEqual(queueSchemaDocument(orderPlaced));
  });
});
