import http from "node:http";
import type { AddressInfo } from "node:net";
import amqp from "amqplib";
import { Redis } from "ioredis";
import { type JetStreamManager, type NatsConnection, connect as natsConnect } from "nats";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import type { MessageContext } from "../../src/contract/handler.js";
import { classifyError, type ErrorClass } from "../../src/contract/handler-errors.js";
import { createRelay } from "../../src/relay/create-relay.js";
import type { RelayHealth } from "../../src/relay/health.js";
import type { Relay } from "../../src/relay/relay.js";
import { HOST, NATS_PORT, probeBrokers, RABBIT_URL, REDIS_PORT } from "../support/brokers.js";
import { memoryLogger } from "../support/memory-logger.js";
import { fakeMessage } from "../support/message.js";
import { startTcpProxy, type TcpProxy } from "../support/tcp-proxy.js";
import { until } from "../support/worker.js";

// A relay whose target cannot take messages (no stream, no exchange, nothing bound, a key of the wrong type)
// or whose broker is down says so in health() — what /relays shows — and in one error log line.

const RUN = `${Date.now().toString(36)}${process.pid.toString(36)}`;
const QUEUE = "q";
let nextId = BigInt(Date.now()) * 1000n + 500n;

function context(queue = QUEUE): MessageContext {
  const id = String(nextId++);
  return fakeMessage({ id, queue, rawPayload: `{"id":${id}}` });
}

async function send(relay: Relay, queue = QUEUE): Promise<"ok" | ErrorClass> {
  try {
    await relay.handler(null, context(queue));
    return "ok";
  } catch (error) {
    return classifyError(error);
  }
}

const { redisDown, natsDown, rabbitDown } = await probeBrokers("relay-health.test");

const made: Relay[] = [];
const proxies: TcpProxy[] = [];
afterEach(async () => {
  await Promise.all(made.splice(0).map((r) => r.close()));
  await Promise.all(proxies.splice(0).map((p) => p.close()));
});

/** A relay serving QUEUE (so `{queue}` targets can be probed), with its log lines. */
async function relay(config: Parameters<typeof createRelay>[0], queue: string | undefined = QUEUE) {
  const { logger, lines } = memoryLogger();
  const created = await createRelay(config, queue === undefined ? { logger } : { logger, queue });
  made.push(created);
  return { relay: created, lines };
}

async function proxyTo(port: number): Promise<TcpProxy> {
  const proxy = await startTcpProxy({ host: HOST, port });
  proxies.push(proxy);
  return proxy;
}

async function untilState(
  relay: Relay,
  state: RelayHealth["state"],
  timeoutMs = 10_000,
): Promise<RelayHealth> {
  let last: RelayHealth | undefined;
  await until(
    async () => {
      last = await relay.health();
      return last.state === state;
    },
    `relay state ${state} (last: ${JSON.stringify(last)})`,
    timeoutMs,
  );
  return last as RelayHealth;
}

/** The broker goes away: the relay says unreachable; it comes back: ok again. */
async function cutAndRestore(r: Relay, proxy: TcpProxy, okTimeoutMs = 10_000): Promise<void> {
  proxy.cut();
  await untilState(r, "unreachable");
  proxy.restore();
  await untilState(r, "ok", okTimeoutMs);
}

describe("http relay health", () => {
  let server: http.Server;
  let port = 0;
  beforeAll(async () => {
    server = http.createServer((req, res) => {
      req.resume();
      req.on("end", () => res.writeHead(204).end());
    });
    await new Promise<void>((resolve) => server.listen(0, HOST, resolve));
    port = (server.address() as AddressInfo).port;
  });
  afterAll(() => new Promise<void>((resolve) => server.close(() => resolve())));

  it("is unreachable after a refused request and ok again after the next answer", async () => {
    const proxy = await proxyTo(port);
    const { relay: r } = await relay({
      type: "http",
      url: `http://${HOST}:${proxy.port}/hook`,
      timeoutMs: 1000,
    });
    expect((await r.health()).state).toBe("ok");
    proxy.cut();
    expect(await send(r)).toBe("transient");
    const down = await r.health();
    expect(down.state).toBe("unreachable");
    expect(down.target).toBe(`POST http://${HOST}:${proxy.port}/hook`);
    expect(down.error).toMatch(/request failed/);
    proxy.restore();
    expect(await send(r)).toBe("ok");
    expect(await r.health()).toEqual({ state: "ok", target: `POST http://${HOST}:${proxy.port}/hook` });
  });
});

describe.skipIf(redisDown !== undefined)("redis relay health", () => {
  let redis: Redis;
  const keys: string[] = [];
  beforeAll(() => {
    redis = new Redis({ host: HOST, port: REDIS_PORT, maxRetriesPerRequest: 1 });
    redis.on("error", () => {});
  });
  afterAll(async () => {
    if (keys.length > 0) await redis.del(...keys);
    redis.disconnect();
  });

  it("is misconfigured while the stream's key holds another type, ok once it is gone", async () => {
    const key = `outbox-relay-health:${RUN}:wrongtype`;
    keys.push(key);
    await redis.set(key, "not a stream");
    const { relay: r, lines } = await relay({
      type: "redis",
      url: `redis://${HOST}:${REDIS_PORT}`,
      stream: key,
    });
    const health = await r.health();
    expect(health.state).toBe("misconfigured");
    expect(health.error).toBe(`redis key ${key} is a string, not a stream: XADD is refused`);
    expect(await send(r)).toBe("transient");
    expect(lines.some((l) => l.level === 50 && /refused XADD/.test(l.msg))).toBe(true);
    await redis.del(key);
    expect((await r.health()).state).toBe("ok");
    expect(await send(r)).toBe("ok");
  });

  it("is unreachable while Redis is down, ok once it is back", async () => {
    const proxy = await proxyTo(REDIS_PORT);
    const stream = `outbox-relay-health:${RUN}:down`;
    keys.push(stream);
    const { relay: r } = await relay({
      type: "redis",
      url: `redis://${HOST}:${proxy.port}`,
      stream,
      timeoutMs: 1000,
    });
    expect((await r.health()).state).toBe("ok");
    await cutAndRestore(r, proxy);
  });
});

describe.skipIf(natsDown !== undefined)("nats relay health", () => {
  let nc: NatsConnection;
  let jsm: JetStreamManager;
  const streams: string[] = [];
  const streamName = (label: string) => {
    const name = `OUTBOX_RELAY_HEALTH_${RUN}_${label}`;
    streams.push(name);
    return name;
  };
  beforeAll(async () => {
    nc = await natsConnect({ servers: `${HOST}:${NATS_PORT}`, timeout: 2000 });
    jsm = await nc.jetstreamManager();
  });
  afterAll(async () => {
    for (const stream of streams) await jsm.streams.delete(stream).catch(() => false);
    await nc.close();
  });

  it("is misconfigured while no stream captures the subject, and says so once in the log", async () => {
    const subject = `outbox-relay-health.${RUN}.nostream.{queue}`;
    const { relay: r, lines } = await relay({ type: "nats", subject, timeoutMs: 1000 });
    const concrete = `outbox-relay-health.${RUN}.nostream.${QUEUE}`;
    const health = await r.health();
    expect(health.state).toBe("misconfigured");
    expect(health.error).toContain(`no JetStream stream captures subject ${concrete}`);
    expect(health.error).toContain(`set the relay's "stream"`);
    expect(await send(r)).toBe("transient");
    expect(await send(r)).toBe("transient");
    const errors = lines.filter((l) => l.level === 50);
    expect(errors.map((l) => l.msg)).toEqual([
      "nats relay target unusable; messages retry until it is fixed",
    ]);

    // Someone creates the stream: the next probe sees it, and messages go through.
    await jsm.streams.add({ name: streamName("later"), subjects: [`outbox-relay-health.${RUN}.nostream.>`] });
    expect(await r.health()).toEqual({
      state: "ok",
      target: `nats nats://127.0.0.1:4222 subject ${subject}`,
    });
    expect(await send(r)).toBe("ok");
  });

  it("is misconfigured when the stream name is taken by a stream that does not capture the subject", async () => {
    const stream = streamName("taken");
    await jsm.streams.add({ name: stream, subjects: [`outbox-relay-health.${RUN}.elsewhere.>`] });
    const { relay: r } = await relay({ type: "nats", subject: `outbox-relay-health.${RUN}.taken`, stream });
    const health = await r.health();
    expect(health.state).toBe("misconfigured");
    expect(health.error).toBe(
      `JetStream stream ${stream} exists but does not capture outbox-relay-health.${RUN}.taken: add the subject to it, or name another stream`,
    );
    expect((await jsm.streams.info(stream)).config.subjects).toEqual([
      `outbox-relay-health.${RUN}.elsewhere.>`,
    ]);
  });

  it("uses a stream that already captures the subject instead of creating an overlapping one", async () => {
    const existing = streamName("existing");
    await jsm.streams.add({ name: existing, subjects: [`outbox-relay-health.${RUN}.shared.>`] });
    const wanted = streamName("wanted");
    const { relay: r } = await relay({
      type: "nats",
      subject: `outbox-relay-health.${RUN}.shared.{queue}`,
      stream: wanted,
    });
    expect((await r.health()).state).toBe("ok");
    expect(await send(r)).toBe("ok");
    expect((await jsm.streams.info(existing)).state.messages).toBe(1);
    await expect(jsm.streams.info(wanted)).rejects.toThrow(/stream not found/);
  });

  it("is unreachable while NATS is down, ok once it is back", async () => {
    const proxy = await proxyTo(NATS_PORT);
    const stream = streamName("down");
    const { relay: r } = await relay({
      type: "nats",
      servers: `nats://${HOST}:${proxy.port}`,
      subject: `outbox-relay-health.${RUN}.down`,
      stream,
      timeoutMs: 1000,
    });
    expect((await r.health()).state).toBe("ok");
    await cutAndRestore(r, proxy, 15_000);
  });
});

describe.skipIf(rabbitDown !== undefined)("rabbitmq relay health", () => {
  let model: amqp.ChannelModel;
  let channel: amqp.Channel;
  const exchanges: string[] = [];
  const queues: string[] = [];
  const name = (label: string) => `outbox-relay-health.${RUN}.${label}`;
  beforeAll(async () => {
    model = await amqp.connect(RABBIT_URL);
    model.on("error", () => {});
    channel = await model.createChannel();
    channel.on("error", () => {});
  });
  afterAll(async () => {
    for (const queue of queues) await channel.deleteQueue(queue).catch(() => {});
    for (const exchange of exchanges) await channel.deleteExchange(exchange).catch(() => {});
    await model.close();
  });

  it("is misconfigured while the exchange does not exist, ok once someone creates it", async () => {
    const exchange = name("missing");
    exchanges.push(exchange);
    const { relay: r, lines } = await relay({ type: "rabbitmq", url: RABBIT_URL, exchange, routingKey: "k" });
    const health = await r.health();
    expect(health.state).toBe("misconfigured");
    expect(health.error).toBe(
      `exchange "${exchange}" does not exist: create it, or set the relay's exchangeType to have it declared`,
    );
    expect(health.target).toBe(`rabbitmq amqp://***@127.0.0.1:5672 exchange "${exchange}" routing key "k"`);
    expect(await send(r)).toBe("transient");
    expect(lines.filter((l) => l.level === 50)).toHaveLength(1);

    await channel.assertExchange(exchange, "topic", { durable: false });
    // The relay retries its connect at most once a second; the probe reconnects and checks again.
    await untilState(r, "ok");
  });

  it("declares the exchange with exchangeType, and delivers to the declared queue", async () => {
    const exchange = name("declared");
    const queue = name("declared-q");
    exchanges.push(exchange);
    queues.push(queue);
    const { relay: r } = await relay({
      type: "rabbitmq",
      url: RABBIT_URL,
      exchange,
      exchangeType: "topic",
      routingKey: "invoice.due",
      declareQueue: queue,
    });
    expect((await r.health()).state).toBe("ok");
    expect(await send(r)).toBe("ok");
    expect((await channel.checkQueue(queue)).messageCount).toBe(1);
  });

  it("is misconfigured after a message comes back unroutable, ok after the next one is routed", async () => {
    const queue = name("late-bound");
    queues.push(queue);
    const { relay: r } = await relay({ type: "rabbitmq", url: RABBIT_URL, routingKey: queue });
    expect((await r.health()).state).toBe("ok");
    expect(await send(r)).toBe("transient");
    const health = await r.health();
    expect(health.state).toBe("misconfigured");
    expect(health.error).toContain(`no queue is bound to exchange "" for routing key "${queue}"`);
    await channel.assertQueue(queue, { durable: false });
    expect(await send(r)).toBe("ok");
    expect((await r.health()).state).toBe("ok");
  });

  it("is unreachable while RabbitMQ is down, ok once it is back", async () => {
    const proxy = await proxyTo(5672);
    const queue = name("down");
    queues.push(queue);
    const { relay: r } = await relay({
      type: "rabbitmq",
      url: `amqp://guest:guest@${HOST}:${proxy.port}`,
      routingKey: queue,
      declareQueue: queue,
      timeoutMs: 1000,
    });
    expect((await r.health()).state).toBe("ok");
    await cutAndRestore(r, proxy);
  });
});
