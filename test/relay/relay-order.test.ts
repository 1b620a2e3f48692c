import amqp from "amqplib";
import { Redis } from "ioredis";
import pino from "pino";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { RelayConfigInput } from "../../src/relay/config.js";
import { createRelay } from "../../src/relay/create-relay.js";
import type { Relay } from "../../src/relay/relay.js";
import { HOST, probeBrokers, RABBIT_URL, REDIS_PORT } from "../support/brokers.js";
import { testDatabase } from "../support/database.js";
import { publisherFor, until, workerFactory } from "../support/worker.js";

/**
 * Relays keep per-key order end to end: with 16 handlers at once and random publish latency, a consumer of
 * the Redis stream or the RabbitMQ queue reads each key's messages in publish order (one in flight per key).
 * Without ordering, the same setup interleaves same-key messages out of order.
 */

const { redisDown, rabbitDown } = await probeBrokers("relay-order.test");
const db = testDatabase("rord");
const workers = workerFactory(db);
const outbox = publisherFor(db.schema);
const RUN = `${Date.now().toString(36)}${process.pid.toString(36)}`;
const KEYS = 4;
const PER_KEY = 25;

beforeAll(() => db.migrate());

/** Publishes KEYS × PER_KEY messages, keys interleaved → ids per key, in publish order. */
async function publishKeyed(queue: string): Promise<Map<string, string[]>> {
  const items = Array.from({ length: KEYS * PER_KEY }, (_, i) => ({
    payload: { i },
    key: `key-${i % KEYS}`,
  }));
  const ids = await db.inTransaction((c) => outbox.publishMany(c, queue, items));
  const byKey = new Map<string, string[]>();
  for (const [i, item] of items.entries()) {
    byKey.set(item.key, [...(byKey.get(item.key) ?? []), ids[i] as string]);
  }
  return byKey;
}

/** The relay's handler behind a random 0–4 ms delay: without ordering, same-key messages overtake. */
function jittered(relay: Relay): Relay["handler"] {
  return async (payload, message) => {
    await new Promise((resolve) => setTimeout(resolve, Math.random() * 4));
    return relay.handler(payload, message);
  };
}

async function relayThrough(config: RelayConfigInput, queue: string): Promise<Relay> {
  const relay = await createRelay(config, { logger: pino({ level: "silent" }), queue });
  await workers.start({
    concurrency: 16,
    queues: { [queue]: { handler: jittered(relay), rawPayload: true } },
  });
  return relay;
}

function groupByKey(entries: { id: string; key: string }[]): Map<string, string[]> {
  const byKey = new Map<string, string[]>();
  for (const e of entries) byKey.set(e.key, [...(byKey.get(e.key) ?? []), e.id]);
  return byKey;
}

describe.skipIf(redisDown !== undefined)("the redis relay keeps per-key order", () => {
  const redis = new Redis({ host: HOST, port: REDIS_PORT, maxRetriesPerRequest: 1, lazyConnect: true });
  const stream = `outbox-order-test:${RUN}`;
  afterAll(async () => {
    await redis.del(stream).catch(() => {});
    redis.disconnect();
  });

  it("each key's entries in the stream follow publish order", async () => {
    const queue = "order.redis";
    const published = await publishKeyed(queue);
    const relay = await relayThrough({ type: "redis", url: `redis://${HOST}:${REDIS_PORT}`, stream }, queue);
    try {
      await until(async () => (await redis.xlen(stream)) === KEYS * PER_KEY, "every message in the stream");
      const rows = await redis.xrange(stream, "-", "+");
      const entries = rows.map(([, fields]) => {
        const f = new Map<string, string>();
        for (let i = 0; i + 1 < fields.length; i += 2) f.set(String(fields[i]), String(fields[i + 1]));
        // The key is the event's subject, copied into its own field for routing without parsing.
        return { id: f.get("id") ?? "", key: f.get("subject") ?? "" };
      });
      expect(groupByKey(entries)).toEqual(published);
    } finally {
      await relay.close();
    }
  });
});

describe.skipIf(rabbitDown !== undefined)("the rabbitmq relay keeps per-key order", () => {
  let model: amqp.ChannelModel;
  let channel: amqp.Channel;
  const target = `outbox-order-test.${RUN}`;
  beforeAll(async () => {
    model = await amqp.connect(RABBIT_URL);
    channel = await model.createChannel();
  });
  afterAll(async () => {
    await channel.deleteQueue(target).catch(() => {});
    await model.close();
  });

  it("each key's messages in the queue follow publish order", async () => {
    const queue = "order.rabbit";
    const published = await publishKeyed(queue);
    const relay = await relayThrough(
      { type: "rabbitmq", url: RABBIT_URL, routingKey: target, declareQueue: target },
      queue,
    );
    try {
      await until(
        async () => (await channel.checkQueue(target)).messageCount === KEYS * PER_KEY,
        "every message in the queue",
      );
      const entries: { id: string; key: string }[] = [];
      for (;;) {
        const m = await channel.get(target, { noAck: true });
        if (m === false) break;
        entries.push({
          id: String(m.properties.messageId),
          key: String(m.properties.headers?.["ce-subject"]),
        });
      }
      expect(groupByKey(entries)).toEqual(published);
    } finally {
      await relay.close();
    }
  });
});
