/**
 * Bytes in, bytes out (DESIGN §4, invariant 12): a payload a producer wrote with plain SQL reaches the
 * handler's `message.rawPayload`, a `rawPayload: true` queue, and every broker as the text Postgres stores
 * for it (`payload::text`), digit for digit: integers beyond 2^53, a trailing zero, non-ASCII characters.
 * Each test checks against what `SELECT payload::text` returns, never against a re-serialised value.
 */
import http from "node:http";
import type { AddressInfo } from "node:net";
import amqp from "amqplib";
import { Redis } from "ioredis";
import { connect as natsConnect } from "nats";
import pino from "pino";
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { z } from "zod";
import { OutboxConfigError } from "../../src/contract/errors.js";
import { createRelay } from "../../src/relay/create-relay.js";
import type { Relay } from "../../src/relay/relay.js";
import { serviceConfigSchema } from "../../src/service/config.js";
import { startService } from "../../src/service/service.js";
import { createWorker } from "../../src/worker/worker.js";
import { HOST, NATS_PORT, probeBrokers, RABBIT_URL, REDIS_PORT } from "../support/brokers.js";
import { testDatabase } from "../support/database.js";
import { until, workerFactory } from "../support/worker.js";

/** Unique per run: broker names below never collide with another run's leftovers. */
const RUN = `${Date.now().toString(36)}${process.pid.toString(36)}`;
const logger = pino({ level: process.env.RELAY_TEST_LOG ?? "silent" });

/**
 * What a producer's plain SQL inserts (JSON text cast to jsonb): two integers no double holds, a decimal
 * with a trailing zero, and a non-ASCII letter next to U+2028 (written as a JSON escape).
 */
const PRODUCED = String.raw`{"i64": 9007199254740993, "big": 12345678901234567890, "f": 1.10, "s": "é\u2028"}`;
/**
 * jsonb's text for it: keys reordered (shorter first), one space after ':' and ',', the escape stored as
 * the character itself; every digit kept. Relays promise this text, not the producer's original bytes.
 */
const JSONB_TEXT = '{"f": 1.10, "s": "é\u2028", "big": 12345678901234567890, "i64": 9007199254740993}';

const db = testDatabase("bytes");
const workers = workerFactory(db);

beforeAll(() => db.migrate());
beforeEach(async () => {
  await db.pool.query(`TRUNCATE ${db.names.messages}, ${db.names.deadLetters}`);
});

/** Insert PRODUCED with plain SQL; returns the row id and the stored text as Postgres prints it. */
async function insertPlain(queue: string): Promise<{ id: string; stored: string }> {
  const inserted = await db.pool.query<{ id: string }>(
    `INSERT INTO ${db.names.messages} (queue, payload) VALUES ($1, $2::jsonb) RETURNING id::text AS id`,
    [queue, PRODUCED],
  );
  const id = inserted.rows[0]?.id ?? "";
  const selected = await db.pool.query<{ stored: string }>(
    `SELECT payload::text AS stored FROM ${db.names.messages} WHERE id = $1`,
    [id],
  );
  const stored = selected.rows[0]?.stored ?? "";
  // Not vacuous: this text is one that a parse and re-serialisation changes.
  expect(stored).toBe(JSONB_TEXT);
  expect(JSON.stringify(JSON.parse(stored))).not.toBe(stored);
  return { id, stored };
}

async function count(table: "messages" | "dead_letters"): Promise<number> {
  const name = table === "messages" ? db.names.messages : db.names.deadLetters;
  return (await db.pool.query(`SELECT count(*)::int AS n FROM ${name}`)).rows[0].n;
}

/** Wait until the worker has acknowledged every row (deleted, not dead-lettered). */
async function untilAcked(what: string): Promise<void> {
  await until(async () => (await count("messages")) === 0, what, 60_000);
  expect(await count("dead_letters"), "dead letters").toBe(0);
}

/** The same bytes: compared as text first (a readable diff), then byte for byte. */
function expectStoredBytes(received: Uint8Array | string, stored: string, what: string): void {
  const bytes = typeof received === "string" ? Buffer.from(received, "utf8") : Buffer.from(received);
  expect(bytes.toString("utf8"), what).toBe(stored);
  expect(Buffer.compare(bytes, Buffer.from(stored, "utf8")), `${what}, byte for byte`).toBe(0);
}

/**
 * What a careful receiver does with numbers beyond 2^53: parse with every number kept as its source text
 * (strings are matched first, so digits inside them are left alone).
 */
function parseKeepingNumberText(text: string): unknown {
  return JSON.parse(
    text.replace(/"(?:[^"\\]|\\.)*"|-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?/g, (token) =>
      token.startsWith('"') ? token : `"${token}"`,
    ),
  );
}

describe("bytes in, bytes out: handlers", () => {
  it("message.rawPayload is the stored text digit for digit; a normal queue still gets the parsed object", async () => {
    const { id, stored } = await insertPlain("bytes.parsed");
    const seen: { id: string; payload: unknown; raw: string }[] = [];
    await workers.start({
      queues: { "bytes.parsed": (payload, m) => void seen.push({ id: m.id, payload, raw: m.rawPayload }) },
    });
    await untilAcked("the parsed queue's row acked");
    expect(seen.map((s) => s.id)).toEqual([id]);
    expect(seen[0]?.raw).toBe(stored);
    // The parsed payload holds doubles: what JSON.parse makes of the stored text, nothing more.
    expect(typeof seen[0]?.payload).toBe("object");
    expect(seen[0]?.payload).toEqual(JSON.parse(stored));
    expect(seen[0]?.payload).toEqual({
      f: 1.1,
      s: "é\u2028",
      // The nearest doubles: 12345678901234567168, and 2^53 for 2^53 + 1.
      big: Number("12345678901234567890"),
      i64: 2 ** 53,
    });
  });

  it("a rawPayload: true queue gets the same stored text as its payload argument", async () => {
    const { id, stored } = await insertPlain("bytes.raw");
    const seen: { id: string; payload: unknown; raw: string }[] = [];
    await workers.start({
      queues: {
        "bytes.raw": {
          rawPayload: true,
          handler: (payload, m) => void seen.push({ id: m.id, payload, raw: m.rawPayload }),
        },
      },
    });
    await untilAcked("the raw queue's row acked");
    expect(seen.map((s) => s.id)).toEqual([id]);
    expect(typeof seen[0]?.payload).toBe("string");
    expect(seen[0]?.payload).toBe(stored);
    expect(seen[0]?.raw).toBe(stored);
  });

  it("refuses a queue with both rawPayload and schema at createWorker, naming the field", () => {
    const attempt = () =>
      createWorker({
        connection: db.url,
        schema: db.schema,
        logger: false,
        queues: {
          "bytes.both": { handler: () => {}, rawPayload: true, schema: z.object({ i64: z.number() }) },
        },
      });
    expect(attempt).toThrow(OutboxConfigError);
    expect(attempt).toThrow(/queues\.bytes\.both\.rawPayload/);
    try {
      attempt();
    } catch (error) {
      expect((error as OutboxConfigError).field).toBe("queues.bytes.both.rawPayload");
    }
  });
});

// ---------------------------------------------------------------------------------------------- relays

const { redisDown, natsDown, rabbitDown } = await probeBrokers("payload-bytes.test");

/** Relays made in a test are closed after it, even when it fails. */
const relays: Relay[] = [];
afterEach(async () => {
  await Promise.all(relays.splice(0).map((r) => r.close()));
});

/**
 * One plainly inserted row through a real worker to a relay, registered as the service registers relays
 * (`rawPayload: true`); resolves once the row is acknowledged, with the stored text to compare against.
 */
async function relayThroughWorker(
  config: Parameters<typeof createRelay>[0],
  queue: string,
): Promise<{ id: string; stored: string }> {
  const relay = await createRelay(config, { logger });
  relays.push(relay);
  const row = await insertPlain(queue);
  const worker = await workers.start({ queues: { [queue]: { handler: relay.handler, rawPayload: true } } });
  await untilAcked(`the ${relay.kind} relay's row acked`);
  await worker.stop({ timeoutMs: 2000 });
  return row;
}

interface Received {
  headers: http.IncomingHttpHeaders;
  body: string;
}

describe("bytes in, bytes out: relays through the worker", () => {
  const received: Received[] = [];
  let server: http.Server;
  let port: number;

  beforeAll(async () => {
    server = http.createServer((req, res) => {
      const chunks: Buffer[] = [];
      req.on("data", (chunk: Buffer) => chunks.push(chunk));
      req.on("end", () => {
        received.push({ headers: req.headers, body: Buffer.concat(chunks).toString("utf8") });
        res.writeHead(204).end();
      });
    });
    await new Promise<void>((resolve) => server.listen(0, HOST, resolve));
    port = (server.address() as AddressInfo).port;
  });
  afterEach(() => {
    received.length = 0;
  });
  afterAll(async () => {
    server.closeAllConnections();
    await new Promise((resolve) => server.close(resolve));
  });

  /** The HTTP body's payload member is the stored text, and the body is still JSON a receiver can read. */
  // CloudEvents binary mode: the body is the payload's stored text itself.
  function expectHttpBody(body: string, stored: string): void {
    expectStoredBytes(body, stored, "http body");
    expect(parseKeepingNumberText(body)).toEqual({
      f: "1.10",
      s: "é\u2028",
      big: "12345678901234567890",
      i64: "9007199254740993",
    });
  }

  it("http: the body is the stored text; valid JSON with every digit", async () => {
    const { id, stored } = await relayThroughWorker(
      { type: "http", url: `http://${HOST}:${port}/hook` },
      "bytes.http",
    );
    expect(received).toHaveLength(1);
    const [request] = received;
    expect(request?.headers["ce-id"]).toBe(id);
    expectHttpBody(request?.body ?? "", stored);
  });

  it("http through the service (relays configured as an operator does): the same body", async () => {
    const queue = "bytes.service";
    const { id, stored } = await insertPlain(queue);
    const config = serviceConfigSchema.parse({
      databaseUrl: db.url,
      schema: db.schema,
      relays: { [queue]: { type: "http", url: `http://${HOST}:${port}/service` } },
      worker: { minPollIntervalMs: 20, maxPollIntervalMs: 200 },
      log: { level: "silent" },
    });
    const service = await startService(config, logger);
    try {
      await untilAcked("the service's relayed row acked");
    } finally {
      await service.stop();
    }
    expect(received).toHaveLength(1);
    expect(received[0]?.headers["ce-id"]).toBe(id);
    expectHttpBody(received[0]?.body ?? "", stored);
  });

  it.skipIf(redisDown !== undefined)("redis: the event's data is the stored text", async () => {
    const stream = `outbox-bytes-test:${RUN}:redis`;
    const redis = new Redis({ host: HOST, port: REDIS_PORT, maxRetriesPerRequest: 1 });
    redis.on("error", () => {});
    try {
      const { id, stored } = await relayThroughWorker(
        { type: "redis", url: `redis://${HOST}:${REDIS_PORT}`, stream },
        "bytes.redis",
      );
      const entries = await redis.xrangeBuffer(stream, "-", "+");
      expect(entries).toHaveLength(1);
      const fields = entries[0]?.[1] ?? [];
      const field = (name: string) =>
        fields[fields.findIndex((f, i) => i % 2 === 0 && f.toString() === name) + 1];
      expect(field("id")?.toString()).toBe(id);
      // Structured mode: the event's last member is `"data":` and the stored text, byte for byte.
      const event = field("event") ?? Buffer.alloc(0);
      const data = event.subarray(event.length - 1 - Buffer.byteLength(stored), event.length - 1);
      expectStoredBytes(data, stored, "redis event data");
      expect(event.subarray(0, event.length - 1 - data.length).toString("utf8")).toMatch(/,"data":$/);
    } finally {
      await redis.del(stream).catch(() => {});
      redis.disconnect();
    }
  });

  it.skipIf(natsDown !== undefined)("nats: the JetStream message data is the stored text", async () => {
    const stream = `OUTBOX_BYTES_TEST_${RUN}`;
    const subject = `outbox-bytes-test.${RUN}.{queue}`;
    const nc = await natsConnect({ servers: `${HOST}:${NATS_PORT}`, timeout: 2000 });
    const jsm = await nc.jetstreamManager();
    try {
      const { id, stored } = await relayThroughWorker(
        { type: "nats", servers: `nats://${HOST}:${NATS_PORT}`, subject, stream },
        "bytes.nats",
      );
      const { state } = await jsm.streams.info(stream);
      expect(state.messages).toBe(1);
      const message = await jsm.streams.getMessage(stream, { seq: state.first_seq });
      expect(message.header.get("Nats-Msg-Id")).toBe(id);
      expectStoredBytes(message.data, stored, "nats message data");
    } finally {
      await jsm.streams.delete(stream).catch(() => false);
      await nc.close();
    }
  });

  it.skipIf(rabbitDown !== undefined)("rabbitmq: the message content is the stored text", async () => {
    const queue = `outbox-bytes-test.${RUN}.rabbitmq`;
    const model = await amqp.connect(RABBIT_URL);
    model.on("error", () => {});
    const channel = await model.createChannel();
    channel.on("error", () => {});
    try {
      const { id, stored } = await relayThroughWorker(
        { type: "rabbitmq", url: RABBIT_URL, routingKey: queue, declareQueue: queue },
        "bytes.rabbitmq",
      );
      const message = await channel.get(queue, { noAck: true });
      if (message === false) throw new Error(`no message in ${queue}`);
      expect(message.properties.messageId).toBe(id);
      expectStoredBytes(message.content, stored, "rabbitmq message content");
      expect(await channel.get(queue, { noAck: true })).toBe(false);
    } finally {
      await channel.deleteQueue(queue).catch(() => {});
      await model.close();
    }
  });
});
