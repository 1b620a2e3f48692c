import { readFile } from "node:fs/promises";
import type http from "node:http";
import type { AddressInfo } from "node:net";
import path from "node:path";
import amqp from "amqplib";
import { Redis } from "ioredis";
import { connect as natsConnect } from "nats";
import { pino } from "pino";
import { afterEach, beforeAll, describe, expect, it } from "vitest";
import type { ReceivedEvent } from "../../examples/consumers/event.js";
import { createWebhookServer } from "../../examples/consumers/http.js";
import { billingInbox, billOrder } from "../../examples/consumers/inbox.js";
import { durableConsumer, handleMessage } from "../../examples/consumers/nats.js";
import { orderPlaced } from "../../examples/consumers/queues.js";
import { handleDelivery } from "../../examples/consumers/rabbitmq.js";
import { ensureGroup, readBatch } from "../../examples/consumers/redis.js";
import type { OrderPlaced } from "../../examples/consumers/types/order.placed.js";
import { consumerFiles } from "../../scripts/consumer-types.js";
import type { MessageContext } from "../../src/contract/handler.js";
import { buildAsyncApi } from "../../src/describe/asyncapi.js";
import { migrate } from "../../src/migrate/migrator.js";
import { defaultEventSource } from "../../src/relay/cloudevents.js";
import { type RelayConfigInput, relayConfigSchema } from "../../src/relay/config.js";
import { createRelay } from "../../src/relay/create-relay.js";
import { httpRelayHeaders, webhookSignature } from "../../src/relay/http.js";
import { HOST, NATS_PORT, probeBrokers, RABBIT_URL, REDIS_PORT } from "../support/brokers.js";
import { testDatabase } from "../support/database.js";
import { FETCH_OWN_HEADERS } from "../support/message.js";
import { publisherFor, until, workerFactory } from "../support/worker.js";

// Each consumer example of examples/consumers/ reads what the worker's relay really sends: a message
// published to the demo's queue goes through the outbox, a worker and the built-in relay to the broker
// (or webhook), and the example hands its handler, through the consumer inbox, the typed payload, key and
// attributes, and bills the order once in the receiving service's schema. The headers each relay sent are also checked against the AsyncAPI document's list for that relay.

const db = testDatabase("consumers");
const workers = workerFactory(db);
const { redisDown, natsDown, rabbitDown } = await probeBrokers("consumer-examples.test");
const RUN = `${Date.now().toString(36)}${process.pid.toString(36)}`;
const logger = pino({ level: "silent" });

const ORDER: OrderPlaced = { orderId: 7, customer: "customer 42 ü", totalCents: 4200 };
const KEY = "customer 42 ü/%";
const TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
const HEADERS = { traceparent: TRACEPARENT, tenant: "acme", "x-tenant": "acme corp" };

const cleanups: (() => Promise<unknown>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c().catch(() => {});
});
/** The receiving service's own schema: the examples' inbox and their billed_orders table. */
const service = db.freshSchema("svc");
let inbox: Awaited<ReturnType<typeof billingInbox>>;
beforeAll(async () => {
  await db.migrate();
  await db.pool.query(`CREATE SCHEMA "${service}"`);
  inbox = await billingInbox(db.pool, service);
});

/** Each example's handler: the event kept for the checks, and the example's effect in the inbox's transaction. */
function collect(events: ReceivedEvent<OrderPlaced>[]) {
  return async (event: ReceivedEvent<OrderPlaced>, client: import("pg").PoolClient) => {
    events.push(event);
    await billOrder(event, client, service);
  };
}

async function billedOnce(sent: { id: string; source: string }): Promise<void> {
  // Each test has an outbox schema of its own, so ids repeat: the event is (source, id).
  const { rows } = await db.pool.query(
    `SELECT count(*)::int AS n FROM "${service}".billed_orders WHERE event_id = $1 AND event_source = $2`,
    [sent.id, sent.source],
  );
  expect(rows[0].n).toBe(1);
}

/**
 * Publishes one order through the outbox and runs a worker whose queue is relayed by `input`; each test has
 * an outbox schema of its own, so no message of another test (delivered or not) reaches its broker.
 */
async function relayOneOrder(input: RelayConfigInput): Promise<{ id: string; source: string }> {
  const schema = db.freshSchema("c");
  await migrate({ connection: db.pool, schema });
  const source = defaultEventSource(db.url, schema);
  const relay = await createRelay(input, { logger, queue: orderPlaced.name, source });
  cleanups.push(() => relay.close());
  await workers.start({
    schema,
    queues: { [orderPlaced.name]: { handler: relay.handler, rawPayload: true } },
  });
  const id = await db.inTransaction((client) =>
    publisherFor(schema).publish(client, orderPlaced, ORDER, { key: KEY, headers: HEADERS }),
  );
  return { id, source };
}

function expectOrder(event: ReceivedEvent<OrderPlaced>, sent: { id: string; source: string }) {
  // Typed by the generated type: a field the schema lacks would not compile.
  const total: number = event.payload.totalCents;
  expect(total).toBe(4200);
  expect(event).toMatchObject({
    id: sent.id,
    type: "order.placed",
    source: sent.source,
    key: KEY,
    payload: ORDER,
    extensions: { tenant: "acme" },
    headers: expect.objectContaining({ "x-tenant": "acme corp" }),
  });
}

/** The header names the AsyncAPI document lists for this relay, plus the message's own two. */
async function documentedHeaders(input: RelayConfigInput): Promise<string[]> {
  const doc = (await buildAsyncApi([orderPlaced], {
    relays: { [orderPlaced.name]: relayConfigSchema.parse(input) },
  })) as { components: { messages: Record<string, { headers: { properties: Record<string, unknown> } }> } };
  const names = Object.keys(Object.values(doc.components.messages)[0]?.headers.properties ?? {});
  // No tracestate in this message; its extension and plain header are the document's "other headers".
  // Lower-cased, as the tests read the wire's names (the document spells Nats-Msg-Id as JetStream does).
  return [...names.filter((n) => !/tracestate/.test(n)), "ce-tenant", "x-tenant"]
    .map((n) => n.toLowerCase())
    .sort();
}

describe("the generated consumer types", () => {
  it("are current: scripts/consumer-types.ts would write what examples/consumers holds", async () => {
    for (const [relative, content] of await consumerFiles()) {
      const current = await readFile(path.join(import.meta.dirname, "../..", relative), "utf8").catch(
        () => "(missing)",
      );
      expect(current, `${relative} is stale: run npx tsx scripts/consumer-types.ts`).toBe(content);
    }
  });
});

describe("consumer examples read what the relays send", () => {
  it("http: the webhook server verifies the signature and decodes the CloudEvent", async () => {
    const secret = `whsec_${Buffer.alloc(32, 3).toString("base64")}`;
    const events: ReceivedEvent<OrderPlaced>[] = [];
    const received: string[][] = [];
    const server = createWebhookServer(inbox, secret, collect(events));
    server.prependListener("request", (req: http.IncomingMessage) => received.push(Object.keys(req.headers)));
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    cleanups.push(() => new Promise((resolve) => server.close(resolve)));
    const input = {
      type: "http",
      url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/outbox`,
      signingSecret: secret,
    } as const;
    const sent = await relayOneOrder(input);
    await until(() => events.length > 0, "the webhook event");
    expectOrder(events[0] as ReceivedEvent<OrderPlaced>, sent);
    await billedOnce(sent);

    expect(received[0]?.filter((n) => !FETCH_OWN_HEADERS.has(n)).sort()).toEqual(
      await documentedHeaders(input),
    );
  });

  it("http: a wrong signature is refused (401) and never reaches the handler", async () => {
    const server = createWebhookServer(inbox, `whsec_${Buffer.alloc(32, 3).toString("base64")}`, () => {
      throw new Error("must not be called");
    });
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    cleanups.push(() => new Promise((resolve) => server.close(resolve)));
    const body = JSON.stringify(ORDER);
    const timestamp = Math.floor(Date.now() / 1000);
    const message = {
      id: "1",
      queue: orderPlaced.name,
      key: null,
      headers: {},
      createdAt: new Date(),
    } as unknown as MessageContext;
    const response = await fetch(`http://127.0.0.1:${(server.address() as AddressInfo).port}/`, {
      method: "POST",
      // A well-formed CloudEvent, signed with another secret: only the signature is wrong.
      headers: {
        ...Object.fromEntries(httpRelayHeaders(message, { source: "/outbox", type: "{queue}" }, undefined)),
        "webhook-id": "1",
        "webhook-timestamp": String(timestamp),
        "webhook-signature": webhookSignature([Buffer.alloc(32, 4)], "1", timestamp, body),
      },
      body,
    });
    expect(response.status).toBe(401);
  });

  it.skipIf(redisDown !== undefined)("redis: XREADGROUP, the structured event decoded", async () => {
    const redis = new Redis({ host: HOST, port: REDIS_PORT, maxRetriesPerRequest: 1 });
    cleanups.push(async () => redis.disconnect());
    const stream = `consumers-test:${RUN}:${orderPlaced.name}`;
    cleanups.push(() => redis.del(stream));
    const options = { stream, group: "billing", consumer: "c1", blockMs: 200 };
    await ensureGroup(redis, stream, options.group);
    const input = {
      type: "redis",
      url: `redis://${HOST}:${REDIS_PORT}`,
      stream: `consumers-test:${RUN}:{queue}`,
    } as const;
    const sent = await relayOneOrder(input);
    const events: ReceivedEvent<OrderPlaced>[] = [];
    await until(
      async () => (await readBatch(redis, inbox, options, collect(events))) > 0 || events.length > 0,
      "a stream entry",
    );
    expectOrder(events[0] as ReceivedEvent<OrderPlaced>, sent);
    await billedOnce(sent);
    // Acked by the example: nothing pending for the group.
    expect(await redis.xpending(stream, options.group)).toEqual([0, null, null, null]);

    const [entry] = await redis.xrange(stream, "-", "+");
    const fields = (entry?.[1] ?? []).filter((_, i) => i % 2 === 0);
    const documented = (await documentedHeaders(input)).filter(
      (n) => !n.startsWith("ce-") && n !== "x-tenant" && !n.startsWith("trace"),
    );
    expect([...fields.filter((n) => n !== "event")].sort()).toEqual(documented);
  });

  it.skipIf(natsDown !== undefined)(
    "nats: a durable JetStream consumer, the ce-* headers decoded",
    async () => {
      const nc = await natsConnect({ servers: `${HOST}:${NATS_PORT}` });
      cleanups.push(() => nc.close());
      const stream = `CONSUMERS_${RUN}`;
      const input = {
        type: "nats",
        servers: `nats://${HOST}:${NATS_PORT}`,
        subject: `consumers.${RUN}.{queue}`,
        stream,
      } as const;
      cleanups.push(async () => (await nc.jetstreamManager()).streams.delete(stream));
      const sent = await relayOneOrder(input);
      await until(async () => {
        try {
          return (await (await nc.jetstreamManager()).streams.info(stream)).state.messages > 0;
        } catch {
          return false;
        }
      }, "the message in the stream");
      const consumer = await durableConsumer(nc, stream, "billing");
      const m = await consumer.next({ expires: 5000 });
      if (m === null) throw new Error("no message from the JetStream consumer");
      const events: ReceivedEvent<OrderPlaced>[] = [];
      await handleMessage(inbox, m, collect(events)); // acks it
      expectOrder(events[0] as ReceivedEvent<OrderPlaced>, sent);
      await billedOnce(sent);
      expect([...(m.headers?.keys() ?? [])].map((n) => n.toLowerCase()).sort()).toEqual(
        await documentedHeaders(input),
      );
    },
  );

  it.skipIf(rabbitDown !== undefined)("rabbitmq: amqplib, the ce-* header entries decoded", async () => {
    const queue = `consumers-${RUN}`;
    const input = {
      type: "rabbitmq",
      url: RABBIT_URL,
      exchange: "",
      routingKey: queue,
      declareQueue: queue,
    } as const;
    const conn = await amqp.connect(RABBIT_URL);
    cleanups.push(() => conn.close());
    const channel = await conn.createChannel();
    cleanups.push(() => channel.deleteQueue(queue));
    const sent = await relayOneOrder(input);
    let msg: amqp.GetMessage | false = false;
    await until(async () => {
      msg = await channel.get(queue, { noAck: false });
      return msg !== false;
    }, "a message on the queue");
    const delivered = msg as unknown as amqp.GetMessage;
    const events: ReceivedEvent<OrderPlaced>[] = [];
    await handleDelivery(inbox, channel, delivered, collect(events)); // acks it
    expectOrder(events[0] as ReceivedEvent<OrderPlaced>, sent);
    await billedOnce(sent);
    expect(Object.keys(delivered.properties.headers ?? {}).sort()).toEqual(await documentedHeaders(input));
  });
});
