import amqp from "amqplib";
import { Redis } from "ioredis";
import { type JetStreamManager, type MsgHdrs, type NatsConnection, connect as natsConnect } from "nats";
import pino from "pino";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { OutboxConfigError } from "../../src/contract/errors.js";
import type { MessageContext } from "../../src/contract/handler.js";
import { PermanentError } from "../../src/contract/handler-errors.js";
import { decodeAmqpMessage, decodeNatsMessage } from "../../src/inbox/transports.js";
import { createRelay } from "../../src/relay/create-relay.js";
import { HOST, NATS_PORT, probeBrokers, RABBIT_URL, REDIS_PORT } from "../support/brokers.js";
import {
  AWKWARD_KEY,
  attributeMessage,
  binaryToEvent,
  expectedAttributes,
  percentDecode,
  rawDataOf,
  structuredToEvent,
} from "../support/cloudevents.js";
import { fakeMessage } from "../support/message.js";
import {
  expectDelivered,
  newIds,
  payloadOf,
  relayScenarios,
  trackRelays,
} from "../support/relay-scenarios.js";

const BURST = 50;
/** Unique per run: names below never collide with another run's leftovers. */
const RUN = `${Date.now().toString(36)}${process.pid.toString(36)}`;
const logger = pino({ level: process.env.RELAY_TEST_LOG ?? "silent" });

function context(id: string, queue: string, key: string | null = `k-${id}`): MessageContext {
  return fakeMessage({
    id,
    queue,
    key,
    headers: { traceparent: `00-${id}`, "x-tenant": "acme" },
    rawPayload: JSON.stringify(payloadOf(id)),
  });
}

const { redisDown, natsDown, rabbitDown } = await probeBrokers("relays.test");

const { outcome, outcomes, retryUntilDelivered, burstThroughOutage } = relayScenarios(context);
const { relay, proxyTo, closeAfter } = trackRelays(logger);

describe("relay config", () => {
  it("reports every bad field and never echoes a secret", async () => {
    const attempt = createRelay(
      { type: "http", url: "https://user:hunter2-password@example.test/hook", hmacSecret: "short-secret" },
      { logger },
    );
    await expect(attempt).rejects.toBeInstanceOf(OutboxConfigError);
    const message = await attempt.catch((error: Error) => error.message);
    expect(message).toMatch(/relay\.url/);
    expect(message).toMatch(/relay\.hmacSecret/);
    expect(message).not.toMatch(/hunter2|short-secret/);
  });

  it("rejects an unknown relay type and unknown fields", async () => {
    await expect(createRelay({ type: "kafka" } as never, { logger })).rejects.toThrow(/relay\.type/);
    await expect(
      createRelay({ type: "redis", stream: "s", streem: "typo" } as never, { logger }),
    ).rejects.toThrow(/streem/);
  });
});

describe("closing a relay whose broker is down", () => {
  const CLOSING = `outbox-relay-test.${RUN}.closing`;
  const STREAM = `OUTBOX_RELAY_TEST_${RUN}_closing`;
  const brokers = [
    {
      name: "redis",
      port: REDIS_PORT,
      down: redisDown,
      config: (port: number) => ({ type: "redis", url: `redis://${HOST}:${port}`, stream: CLOSING }) as const,
      cleanup: async () => {
        const client = new Redis({ host: HOST, port: REDIS_PORT, maxRetriesPerRequest: 0 });
        client.on("error", () => {});
        await client.del(CLOSING).finally(() => client.disconnect());
      },
    },
    {
      name: "nats",
      port: NATS_PORT,
      down: natsDown,
      config: (port: number) =>
        ({ type: "nats", servers: `nats://${HOST}:${port}`, subject: CLOSING, stream: STREAM }) as const,
      cleanup: async () => {
        const nc = await natsConnect({ servers: `${HOST}:${NATS_PORT}`, timeout: 2000 });
        await (await nc.jetstreamManager()).streams.delete(STREAM).finally(() => nc.close());
      },
    },
    {
      name: "rabbitmq",
      port: 5672,
      down: rabbitDown,
      config: (port: number) =>
        ({
          type: "rabbitmq",
          url: `amqp://guest:guest@${HOST}:${port}`,
          routingKey: CLOSING,
          declareQueue: CLOSING,
        }) as const,
      cleanup: async () => {
        const model = await amqp.connect(RABBIT_URL);
        const channel = await model.createChannel();
        await channel.deleteQueue(CLOSING).finally(() => model.close());
      },
    },
  ];

  for (const broker of brokers) {
    it.skipIf(broker.down !== undefined)(
      `${broker.name}: close() is prompt, idempotent, and final`,
      async () => {
        try {
          const proxy = await proxyTo(broker.port);
          const relayed = await createRelay({ ...broker.config(proxy.port), timeoutMs: 1000 }, { logger });
          const [a = "", b = ""] = newIds(2);
          expect(await outcome(relayed, a, "q")).toBe("ok");
          proxy.cut();
          expect(await outcome(relayed, b, "q")).toBe("transient");
          // close() ends by its own deadlines (timeoutMs, twice it at most), never a library's own: timers
          // fire in the order they are due, so it must end before one due at ten times timeoutMs.
          let late = false;
          const sentinel = setTimeout(() => {
            late = true;
          }, 10 * 1000);
          await Promise.all([relayed.close(), relayed.close()]);
          await relayed.close();
          clearTimeout(sentinel);
          expect(late).toBe(false);
          // The broker is reachable again: a relay that close() had not finished with would connect for
          // this call and deliver it. The call itself is the probe; no pause before it.
          proxy.restore();
          expect(await outcome(relayed, b, "q")).toBe("transient");
        } finally {
          await broker.cleanup();
        }
      },
    );
  }
});

describe.skipIf(redisDown !== undefined)("redis relay", () => {
  let redis: Redis;
  const streams: string[] = [];
  const streamName = (label: string) => {
    const name = `outbox-relay-test:${RUN}:${label}`;
    streams.push(name);
    return name;
  };

  beforeAll(() => {
    redis = new Redis({ host: HOST, port: REDIS_PORT, maxRetriesPerRequest: 1 });
    redis.on("error", () => {});
  });
  afterAll(async () => {
    if (streams.length > 0) await redis.del(...streams);
    redis.disconnect();
  });

  async function entries(stream: string): Promise<Array<Record<string, string>>> {
    const rows = await redis.xrange(stream, "-", "+");
    return rows.map(([, fields]) => {
      const record: Record<string, string> = {};
      for (let i = 0; i + 1 < fields.length; i += 2) record[String(fields[i])] = String(fields[i + 1]);
      return record;
    });
  }

  it("XADDs a burst of 50 as CloudEvents; a second call for an id adds a duplicate", async () => {
    const stream = streamName("burst");
    const template = stream.replace(/burst$/, "{queue}");
    const relayed = await relay({ type: "redis", url: `redis://${HOST}:${REDIS_PORT}`, stream: template });
    const ids = newIds(BURST);
    const results = await outcomes(relayed, ids, "burst");
    expect([...results.values()].every((r) => r === "ok")).toBe(true);
    const twice = ids.slice(0, 5);
    expect([...(await outcomes(relayed, twice, "burst")).values()].every((r) => r === "ok")).toBe(true);

    const rows = await entries(stream);
    expect(rows).toHaveLength(BURST + twice.length);
    expectDelivered(
      rows.map((r) => r.id ?? ""),
      ids,
      new Set(twice),
    );
    for (const id of twice) expect(rows.filter((r) => r.id === id)).toHaveLength(2);
    const first = rows.find((r) => r.id === ids[10]);
    expect(first).toEqual({
      id: ids[10],
      type: "burst",
      subject: `k-${ids[10]}`,
      headers: JSON.stringify({ "x-tenant": "acme" }),
      event: expect.any(String),
    });
    expect(JSON.parse(first?.event ?? "")).toEqual({
      specversion: "1.0",
      id: ids[10],
      source: "/outbox",
      type: "burst",
      subject: `k-${ids[10]}`,
      time: expect.stringMatching(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/),
      datacontenttype: "application/json",
      traceparent: `00-${ids[10]}`,
      data: payloadOf(ids[10] ?? ""),
    });

    const [keyless = ""] = newIds(1);
    // The relay sends the stored JSON text, whatever the (unparsed) payload argument holds.
    await relayed.handler("null", {
      ...context(keyless, "burst", null),
      headers: {},
      rawPayload: "null",
    });
    const last = (await entries(stream)).at(-1);
    expect(last).toEqual({ id: keyless, type: "burst", event: expect.any(String) });
    expect(rawDataOf(last?.event ?? "")).toBe("null");
    expect(JSON.parse(last?.event ?? "")).not.toHaveProperty("subject");
  });

  it("XADDs a structured CloudEvent: every attribute, the data byte for byte, other headers in `headers`", async () => {
    const stream = streamName("ce");
    const relayed = await relay({
      type: "redis",
      url: `redis://${HOST}:${REDIS_PORT}`,
      stream,
      eventSource: "/outbox/test/ce",
      eventType: "com.example.{queue}",
    });
    const [keyed = "", keyless = ""] = newIds(2);
    const keyedMessage = attributeMessage(keyed, "orders.placed", AWKWARD_KEY);
    await relayed.handler(null, keyedMessage);
    await relayed.handler(null, attributeMessage(keyless, "orders.placed", null));

    const rows = await redis.xrange(stream, "-", "+");
    expect(rows).toHaveLength(2);
    const [[, fields = []] = ["", []], [, keylessFields = []] = ["", []]] = rows;
    // The field order is part of the format: id first, the event last.
    expect(fields.slice(0, -1)).toEqual([
      "id",
      keyed,
      "type",
      "com.example.orders.placed",
      "subject",
      AWKWARD_KEY,
      "headers",
      JSON.stringify({ "x-tenant": "acme" }),
      "event",
    ]);
    const event = fields.at(-1) ?? "";
    const expected = {
      ...expectedAttributes(keyed, "/outbox/test/ce", "com.example.orders.placed"),
      datacontenttype: "application/json",
      subject: AWKWARD_KEY,
    };
    const { data: _, ...attributes } = JSON.parse(event) as Record<string, unknown>;
    expect(attributes).toEqual(expected);
    expect(rawDataOf(event)).toBe(keyedMessage.rawPayload);
    const parsed = structuredToEvent(event);
    expect(parsed).toMatchObject(expected);
    expect(parsed.tenant).toBe("acme corp");

    expect(keylessFields.filter((_, i) => i % 2 === 0)).toEqual(["id", "type", "headers", "event"]);
    expect(JSON.parse(keylessFields.at(-1) ?? "")).not.toHaveProperty("subject");
  });

  it("names the source after the service when the config names none", async () => {
    const stream = streamName("source");
    const relayed = await createRelay(
      { type: "redis", url: `redis://${HOST}:${REDIS_PORT}`, stream },
      { logger, source: "/outbox/shop/public" },
    );
    closeAfter(relayed);
    const [id = ""] = newIds(1);
    await relayed.handler(null, context(id, "orders"));
    const [row] = await entries(stream);
    expect(JSON.parse(row?.event ?? "")).toMatchObject({ source: "/outbox/shop/public", type: "orders" });
  });

  it("loses nothing when the connection is cut mid-burst", async () => {
    const proxy = await proxyTo(REDIS_PORT);
    const stream = streamName("outage");
    const relayed = await relay({
      type: "redis",
      url: `redis://${HOST}:${proxy.port}`,
      stream,
      timeoutMs: 2000,
    });
    const ids = newIds(BURST);
    const lostAcks = await burstThroughOutage(relayed, proxy, ids, "outage", () => redis.xlen(stream));
    expectDelivered(
      (await entries(stream)).map((r) => r.id ?? ""),
      ids,
      lostAcks,
    );
  });

  it("times out on a silent network and recovers once it is back", async () => {
    const proxy = await proxyTo(REDIS_PORT);
    const stream = streamName("blackhole");
    const relayed = await relay({
      type: "redis",
      url: `redis://${HOST}:${proxy.port}`,
      stream,
      timeoutMs: 500,
    });
    const [a = "", b = ""] = newIds(2);
    expect(await outcome(relayed, a, "q")).toBe("ok");
    proxy.blackhole();
    // Nothing comes back through the black hole: only the relay's timeout can end the call.
    expect(await outcome(relayed, b, "q")).toBe("transient");
    proxy.restore();
    await retryUntilDelivered(relayed, [b], "q");
    expect((await entries(stream)).map((r) => r.id)).toContain(b);
  });

  it("starts while Redis is down and delivers once it is up", async () => {
    const proxy = await proxyTo(REDIS_PORT);
    proxy.cut();
    const stream = streamName("late");
    const relayed = await relay({
      type: "redis",
      url: `redis://${HOST}:${proxy.port}`,
      stream,
      timeoutMs: 1000,
    });
    const [id = ""] = newIds(1);
    expect(await outcome(relayed, id, "q")).toBe("transient");
    proxy.restore();
    await retryUntilDelivered(relayed, [id], "q");
    expect((await entries(stream)).map((r) => r.id)).toEqual([id]);
  });
});

/** Every NATS header of a message, by name as sent. */
function headerMap(headers: MsgHdrs | undefined): Record<string, string> {
  const map: Record<string, string> = {};
  for (const name of headers?.keys() ?? []) map[name] = headers?.get(name) ?? "";
  return map;
}

/** The CloudEvents attributes in NATS headers, decoded by the binding's rules. */
function ceAttributes(headers: MsgHdrs | undefined): Record<string, string> {
  const attributes: Record<string, string> = {};
  for (const [name, value] of Object.entries(headerMap(headers))) {
    if (/^ce-/i.test(name)) attributes[name.slice(3).toLowerCase()] = percentDecode(value);
  }
  return attributes;
}

describe.skipIf(natsDown !== undefined)("nats relay", () => {
  let nc: NatsConnection;
  let jsm: JetStreamManager;
  const streams: string[] = [];
  const target = (label: string) => {
    const stream = `OUTBOX_RELAY_TEST_${RUN}_${label}`;
    streams.push(stream);
    return { stream, subject: `outbox-relay-test.${RUN}.${label}.{queue}` };
  };

  beforeAll(async () => {
    nc = await natsConnect({ servers: `${HOST}:${NATS_PORT}`, timeout: 2000 });
    jsm = await nc.jetstreamManager();
  });
  afterAll(async () => {
    for (const stream of streams) await jsm.streams.delete(stream).catch(() => false);
    await nc.close();
  });

  async function stored(stream: string) {
    const { state } = await jsm.streams.info(stream);
    const messages = [];
    for (let seq = state.first_seq; seq <= state.last_seq && messages.length < 1000; seq++) {
      messages.push(await jsm.streams.getMessage(stream, { seq }));
    }
    return messages;
  }

  it("publishes a burst of 50 exactly once, even when every id is handled twice", async () => {
    const { stream, subject } = target("burst");
    const relayed = await relay({ type: "nats", servers: `nats://${HOST}:${NATS_PORT}`, subject, stream });
    const ids = newIds(BURST);
    for (let round = 0; round < 2; round++) {
      const results = await outcomes(relayed, ids, "orders.placed");
      expect([...results.values()].every((r) => r === "ok")).toBe(true);
    }

    const messages = await stored(stream);
    expect(messages).toHaveLength(BURST);
    expectDelivered(
      messages.map((m) => m.header.get("Nats-Msg-Id")),
      ids,
    );
    const message = messages[0];
    const id = message?.header.get("Nats-Msg-Id") ?? "";
    expect(message?.subject).toBe(`outbox-relay-test.${RUN}.burst.orders.placed`);
    expect(message?.string()).toBe(JSON.stringify(payloadOf(id)));
    expect(headerMap(message?.header)).toEqual({
      "Nats-Msg-Id": id,
      "ce-specversion": "1.0",
      "ce-id": id,
      "ce-source": "/outbox",
      "ce-type": "orders.placed",
      "ce-subject": `k-${id}`,
      "ce-time": expect.stringMatching(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/),
      "ce-datacontenttype": "application/json",
      "ce-traceparent": `00-${id}`,
      traceparent: `00-${id}`,
      "x-tenant": "acme",
    });
  });

  it("sends a CloudEvent in the NATS binding's binary mode: every attribute a ce- header, percent-encoded", async () => {
    const { stream, subject } = target("ce");
    const relayed = await relay({
      type: "nats",
      servers: `nats://${HOST}:${NATS_PORT}`,
      subject,
      stream,
      eventSource: "/outbox/test/ce",
      eventType: "com.example.{queue}",
    });
    const [keyed = "", keyless = ""] = newIds(2);
    const keyedMessage = attributeMessage(keyed, "orders.placed", AWKWARD_KEY);
    await relayed.handler(null, keyedMessage);
    await relayed.handler(null, attributeMessage(keyless, "orders.placed", null));

    const [first, second] = await stored(stream);
    const type = "com.example.orders.placed";
    // On the wire, as the binding spells it (§3.1.3.2): space, quote, percent and non-ASCII as %XX.
    expect(headerMap(first?.header)).toEqual({
      "Nats-Msg-Id": keyed,
      "ce-specversion": "1.0",
      "ce-id": keyed,
      "ce-source": "/outbox/test/ce",
      "ce-type": type,
      "ce-subject": "k%20%C3%BC%E2%82%AC%20%2520%20%22q%22%20%F0%9F%98%80",
      "ce-time": "2026-01-02T03:04:05.678Z",
      "ce-datacontenttype": "application/json",
      "ce-traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
      "ce-tracestate": "vendor=a%20b",
      "ce-tenant": "acme%20corp",
      // The plain W3C headers too, for tracing instrumentation that reads only those.
      traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
      tracestate: "vendor=a%20b",
      "x-tenant": "acme",
    });
    // Decoded by the binding's rules, then validated by the SDK.
    const attributes = ceAttributes(first?.header);
    const expected = { ...expectedAttributes(keyed, "/outbox/test/ce", type), subject: AWKWARD_KEY };
    expect(attributes).toEqual({ ...expected, datacontenttype: "application/json" });
    const body = Buffer.from(first?.data ?? []).toString("utf8");
    expect(body).toBe(keyedMessage.rawPayload);
    const event = binaryToEvent(attributes, body);
    expect(event).toMatchObject({ ...expected, datacontenttype: "application/json" });
    expect(event.tenant).toBe("acme corp");

    expect(ceAttributes(second?.header)).not.toHaveProperty("subject");
    expect(ceAttributes(second?.header).id).toBe(keyless);
  });

  it("contentMode structured: the data is the JSON event format (the released binding, 1.0.2), read by the SDK and the inbox", async () => {
    const { stream, subject } = target("structured");
    const relayed = await relay({
      type: "nats",
      servers: `nats://${HOST}:${NATS_PORT}`,
      subject,
      stream,
      contentMode: "structured",
      eventSource: "/outbox/test/structured",
    });
    const [id = ""] = newIds(1);
    const message = attributeMessage(id, "orders.placed", AWKWARD_KEY);
    await relayed.handler(null, message);
    const [got] = await stored(stream);
    const headers = headerMap(got?.header);
    expect(Object.keys(headers).filter((n) => /^ce-/i.test(n))).toEqual([]);
    expect(headers).toMatchObject({
      "Nats-Msg-Id": id,
      "Content-Type": "application/cloudevents+json; charset=utf-8",
      "x-tenant": "acme",
    });
    const body = Buffer.from(got?.data ?? []).toString("utf8");
    // The stored payload spliced in byte for byte (its 20-digit number intact), the key as it is.
    expect(rawDataOf(body)).toBe(message.rawPayload);
    const event = structuredToEvent(body);
    expect(event).toMatchObject({
      ...expectedAttributes(id, "/outbox/test/structured", "orders.placed"),
      subject: AWKWARD_KEY,
    });
    expect(event.tenant).toBe("acme corp");
    if (got === undefined) throw new Error("no message stored");
    expect(decodeNatsMessage({ headers: got.header, data: got.data })).toMatchObject({
      id,
      subject: AWKWARD_KEY,
    });
  });

  it("dead-letters an event over the server's max_payload with both sizes, without publishing it", async () => {
    const { stream, subject } = target("big");
    const relayed = await relay({ type: "nats", servers: `nats://${HOST}:${NATS_PORT}`, subject, stream });
    const max = nc.info?.max_payload ?? 1024 * 1024;
    const [id = ""] = newIds(1);
    const big = fakeMessage({
      id,
      queue: "orders.placed",
      rawPayload: JSON.stringify({ blob: "x".repeat(max) }),
    });
    const error = await Promise.resolve()
      .then(() => relayed.handler(null, big))
      .then(
        () => undefined,
        (e: unknown) => e,
      );
    expect(error).toBeInstanceOf(PermanentError);
    expect(String((error as Error).message)).toMatch(
      new RegExp(
        `event of ${Buffer.byteLength(big.rawPayload)} bytes is over the NATS server's max_payload of ${max} bytes`,
      ),
    );
    expect((await jsm.streams.info(stream)).state.messages).toBe(0);
  });

  it("loses nothing and duplicates nothing when the connection is cut mid-burst", async () => {
    const proxy = await proxyTo(NATS_PORT);
    const { stream, subject } = target("outage");
    const relayed = await relay({
      type: "nats",
      servers: `nats://${HOST}:${proxy.port}`,
      subject,
      stream,
      timeoutMs: 1500,
    });
    const ids = newIds(BURST);
    await burstThroughOutage(
      relayed,
      proxy,
      ids,
      "q",
      async () => (await jsm.streams.info(stream)).state.messages,
    );
    // The ids whose acks were lost were stored, then published again: the server dropped the second copy.
    const messages = await stored(stream);
    expectDelivered(
      messages.map((m) => m.header.get("Nats-Msg-Id")),
      ids,
    );
  });

  it("leaves an existing stream as its owner configured it", async () => {
    const { stream } = target("owned");
    await jsm.streams.add({ name: stream, subjects: [`outbox-relay-test.${RUN}.owned-elsewhere.>`] });
    const subject = `outbox-relay-test.${RUN}.owned.{queue}`;
    const relayed = await relay({ type: "nats", subject, stream, timeoutMs: 1000 });
    const [id = ""] = newIds(1);
    expect(await outcome(relayed, id, "q")).toBe("transient");
    const { config } = await jsm.streams.info(stream);
    expect(config.subjects).toEqual([`outbox-relay-test.${RUN}.owned-elsewhere.>`]);
  });

  it("retries, not dead-letters, a subject no stream captures", async () => {
    const relayed = await relay({
      type: "nats",
      subject: `outbox-relay-test.${RUN}.nowhere.{queue}`,
      timeoutMs: 1000,
    });
    const [id = ""] = newIds(1);
    expect(await outcome(relayed, id, "q")).toBe("transient");
  });

  it("starts while NATS is down and delivers once it is up", async () => {
    const proxy = await proxyTo(NATS_PORT);
    proxy.cut();
    const { stream, subject } = target("late");
    const relayed = await relay({
      type: "nats",
      servers: [`nats://${HOST}:${proxy.port}`],
      subject,
      stream,
      timeoutMs: 1000,
    });
    const [id = ""] = newIds(1);
    expect(await outcome(relayed, id, "q")).toBe("transient");
    proxy.restore();
    await retryUntilDelivered(relayed, [id], "q");
    expect((await stored(stream)).map((m) => m.header.get("Nats-Msg-Id"))).toEqual([id]);
  });
});

describe.skipIf(rabbitDown !== undefined)("rabbitmq relay", () => {
  let model: amqp.ChannelModel;
  let channel: amqp.Channel;
  const queues: string[] = [];
  const queueName = (label: string) => {
    const name = `outbox-relay-test.${RUN}.${label}`;
    queues.push(name);
    return name;
  };

  beforeAll(async () => {
    model = await amqp.connect(RABBIT_URL);
    model.on("error", () => {});
    channel = await model.createChannel();
    channel.on("error", () => {});
  });
  afterAll(async () => {
    for (const queue of queues) await channel.deleteQueue(queue).catch(() => {});
    await model.close();
  });

  async function drain(queue: string): Promise<amqp.GetMessage[]> {
    const messages: amqp.GetMessage[] = [];
    const deadline = Date.now() + 10_000;
    while (messages.length < 1000 && Date.now() < deadline) {
      const message = await channel.get(queue, { noAck: true });
      if (message === false) break;
      messages.push(message);
    }
    return messages;
  }

  it("publishes a burst of 50 confirmed and persistent; a second call for an id publishes it again", async () => {
    const queue = queueName("burst");
    const relayed = await relay({
      type: "rabbitmq",
      url: RABBIT_URL,
      routingKey: "{queue}",
      declareQueue: queue,
    });
    const ids = newIds(BURST);
    expect([...(await outcomes(relayed, ids, queue)).values()].every((r) => r === "ok")).toBe(true);
    const twice = ids.slice(0, 5);
    expect([...(await outcomes(relayed, twice, queue)).values()].every((r) => r === "ok")).toBe(true);

    const messages = await drain(queue);
    expect(messages).toHaveLength(BURST + twice.length);
    expectDelivered(
      messages.map((m) => String(m.properties.messageId)),
      ids,
      new Set(twice),
    );
    const message = messages.find((m) => m.properties.messageId === ids[7]);
    expect(message?.properties).toMatchObject({
      contentType: "application/json",
      deliveryMode: 2,
      type: queue,
    });
    expect(message?.properties.headers).toEqual({
      "ce-specversion": "1.0",
      "ce-id": ids[7],
      "ce-source": "/outbox",
      "ce-type": queue,
      "ce-subject": `k-${ids[7]}`,
      "ce-time": expect.stringMatching(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/),
      "ce-traceparent": `00-${ids[7]}`,
      traceparent: `00-${ids[7]}`,
      "x-tenant": "acme",
    });
    expect(message?.content.toString("utf8")).toBe(JSON.stringify(payloadOf(ids[7] ?? "")));
  });

  it("sends a CloudEvent in binary mode: ce- headers as they are, datacontenttype as contentType", async () => {
    const queue = queueName("ce");
    const relayed = await relay({
      type: "rabbitmq",
      url: RABBIT_URL,
      routingKey: queue,
      declareQueue: queue,
      eventSource: "/outbox/test/ce",
      eventType: "com.example.{queue}",
    });
    const [keyed = "", keyless = ""] = newIds(2);
    const keyedMessage = attributeMessage(keyed, "orders.placed", AWKWARD_KEY);
    await relayed.handler(null, keyedMessage);
    await relayed.handler(null, attributeMessage(keyless, "orders.placed", null));

    const [first, second] = await drain(queue);
    const type = "com.example.orders.placed";
    if (first === undefined) throw new Error("no message in the queue");
    const { headers, ...properties } = first.properties;
    expect(properties).toMatchObject({
      messageId: keyed,
      contentType: "application/json",
      type,
      timestamp: Math.floor(keyedMessage.createdAt.getTime() / 1000),
      deliveryMode: 2,
    });
    const expected = { ...expectedAttributes(keyed, "/outbox/test/ce", type), subject: AWKWARD_KEY };
    expect(headers).toEqual({
      ...Object.fromEntries(Object.entries(expected).map(([name, value]) => [`ce-${name}`, value])),
      // The plain W3C entries too, for tracing instrumentation that reads only those.
      traceparent: expectedAttributes(keyed, "", "").traceparent,
      tracestate: expectedAttributes(keyed, "", "").tracestate,
      "x-tenant": "acme",
    });
    const body = first.content.toString("utf8");
    expect(body).toBe(keyedMessage.rawPayload);
    const attributes: Record<string, string> = { datacontenttype: String(properties.contentType) };
    for (const [name, value] of Object.entries(headers ?? {})) {
      if (name.startsWith("ce-")) attributes[name.slice(3)] = String(value);
    }
    const event = binaryToEvent(attributes, body);
    expect(event).toMatchObject({ ...expected, datacontenttype: "application/json" });
    expect(event.tenant).toBe("acme corp");

    expect(second?.properties.messageId).toBe(keyless);
    expect(second?.properties.headers).not.toHaveProperty("ce-subject");
    expect(second?.properties.headers?.["ce-id"]).toBe(keyless);
  });

  it("headerPrefix cloudEvents_ / cloudEvents: names the attributes as the CloudEvents AMQP binding does; the inbox reads both", async () => {
    for (const prefix of ["cloudEvents_", "cloudEvents:"] as const) {
      const queue = queueName(`amqp-binding-${prefix.slice(-1) === "_" ? "u" : "c"}`);
      const relayed = await relay({
        type: "rabbitmq",
        url: RABBIT_URL,
        routingKey: queue,
        declareQueue: queue,
        headerPrefix: prefix,
      });
      const [id = ""] = newIds(1);
      const message = attributeMessage(id, "orders.placed", "k-1");
      await relayed.handler(null, message);
      const [got] = await drain(queue);
      if (got === undefined) throw new Error("no message in the queue");
      const names = Object.keys(got.properties.headers ?? {});
      expect(names.filter((n) => n.startsWith("ce-"))).toEqual([]);
      expect(got.properties.headers).toMatchObject({
        [`${prefix}specversion`]: "1.0",
        [`${prefix}id`]: id,
        [`${prefix}subject`]: "k-1",
        "x-tenant": "acme",
      });
      const event = decodeAmqpMessage(got);
      expect(event).toMatchObject({ id, subject: "k-1", specversion: "1.0", type: "orders.placed" });
    }
  });

  it("loses nothing when the connection is cut mid-burst", async () => {
    const proxy = await proxyTo(5672);
    const queue = queueName("outage");
    const relayed = await relay({
      type: "rabbitmq",
      url: `amqp://guest:guest@${HOST}:${proxy.port}`,
      routingKey: queue,
      declareQueue: queue,
      timeoutMs: 2000,
    });
    const ids = newIds(BURST);
    const lostAcks = await burstThroughOutage(
      relayed,
      proxy,
      ids,
      queue,
      async () => (await channel.checkQueue(queue)).messageCount,
    );
    expectDelivered(
      (await drain(queue)).map((m) => String(m.properties.messageId)),
      ids,
      lostAcks,
    );
  });

  it("retries, not drops, a message no queue is bound for", async () => {
    const relayed = await relay({
      type: "rabbitmq",
      url: RABBIT_URL,
      routingKey: `outbox-relay-test.${RUN}.nowhere`,
    });
    const [id = ""] = newIds(1);
    expect(await outcome(relayed, id, "q")).toBe("transient");
  });

  it("starts while RabbitMQ is down and delivers once it is up", async () => {
    const proxy = await proxyTo(5672);
    proxy.cut();
    const queue = queueName("late");
    const relayed = await relay({
      type: "rabbitmq",
      url: `amqp://guest:guest@${HOST}:${proxy.port}`,
      routingKey: queue,
      declareQueue: queue,
      timeoutMs: 1000,
    });
    const [id = ""] = newIds(1);
    expect(await outcome(relayed, id, "q")).toBe("transient");
    proxy.restore();
    await retryUntilDelivered(relayed, [id], "q");
    expect((await drain(queue)).map((m) => m.properties.messageId)).toEqual([id]);
  });

  it("close() is idempotent, and a closed relay fails as transient", async () => {
    const relayed = await relay({ type: "rabbitmq", url: RABBIT_URL, routingKey: queueName("closed") });
    await Promise.all([relayed.close(), relayed.close()]);
    await relayed.close();
    const [id = ""] = newIds(1);
    expect(await outcome(relayed, id, "q")).toBe("transient");
  });
});
