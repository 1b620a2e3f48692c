import { randomBytes } from "node:crypto";
import http from "node:http";
import type { AddressInfo } from "node:net";
import amqp from "amqplib";
import { Redis } from "ioredis";
import { AckPolicy, connect as natsConnect } from "nats";
import type pg from "pg";
import { pino } from "pino";
import { Webhook } from "standardwebhooks";
import { afterEach, beforeAll, describe, expect, it } from "vitest";
import {
  createInbox,
  createWebhookHandler,
  handleAmqpMessage,
  handleNatsMessage,
  handleRedisEntry,
  type InboxEvent,
} from "../../src/inbox/index.js";
import { migrate } from "../../src/migrate/migrator.js";
import { defaultEventSource } from "../../src/relay/cloudevents.js";
import type { RelayConfigInput } from "../../src/relay/config.js";
import { createRelay } from "../../src/relay/create-relay.js";
import { httpRelayHeaders, webhookSignature } from "../../src/relay/http.js";
import { constant } from "../../src/retry/strategies.js";
import { signingKey } from "../../src/wire/webhook-signature.js";
import { HOST, NATS_PORT, probeBrokers, RABBIT_URL, REDIS_PORT } from "../support/brokers.js";
import { testDatabase } from "../support/database.js";
import { fakeMessage } from "../support/message.js";
import { publisherFor, until, workerFactory } from "../support/worker.js";

// The consumer inbox with real deliveries: a worker relays each message through the built-in relay to a
// real receiver (a node:http server, Redis, NATS JetStream, RabbitMQ), the receiver handles it through the
// inbox, and the same delivery comes again (a lost response, a broker redelivery): the effect row, in the
// receiver's database, exists once.

const db = testDatabase("inboxrelay");
const workers = workerFactory(db);
const { redisDown, natsDown, rabbitDown } = await probeBrokers("inbox-relays.test");
const RUN = `${Date.now().toString(36)}${process.pid.toString(36)}`;
const logger = pino({ level: "silent" });
const QUEUE = "order.placed";
const KEY = "customer ü/%41 😀";
/** The receiving service's own schema: its inbox table and its effects. */
const receiver = db.freshSchema("rcv");
const effects = `"${receiver}".effects`;

const cleanups: (() => Promise<unknown>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c().catch(() => {});
});

const inbox = createInbox<pg.PoolClient>({ pool: db.pool, consumer: "billing", schema: receiver });

beforeAll(async () => {
  await inbox.install();
  await db.pool.query(`CREATE TABLE ${effects} (event_id text NOT NULL, source text NOT NULL, subject text)`);
});

/** The receiver's effect: a plain insert with no unique key, so a second application shows. */
async function applyEffect(event: InboxEvent, client: pg.PoolClient): Promise<void> {
  await client.query(`INSERT INTO ${effects} (event_id, source, subject) VALUES ($1, $2, $3)`, [
    event.id,
    event.source,
    event.subject ?? null,
  ]);
}

async function effectRows(id: string, source: string): Promise<number> {
  const { rows } = await db.pool.query(
    `SELECT count(*)::int AS n FROM ${effects} WHERE event_id = $1 AND source = $2`,
    [id, source],
  );
  return rows[0].n;
}

/** Publishes one order through a fresh outbox schema and a worker relaying it with `input`. */
async function relayOneOrder(
  input: RelayConfigInput,
): Promise<{ id: string; source: string; schema: string }> {
  const schema = db.freshSchema("o");
  await migrate({ connection: db.pool, schema });
  const source = defaultEventSource(db.url, schema);
  const relay = await createRelay(input, { logger, queue: QUEUE, source });
  cleanups.push(() => relay.close());
  await workers.start({
    schema,
    retry: constant(50),
    queues: { [QUEUE]: { handler: relay.handler, rawPayload: true } },
  });
  const id = await db.inTransaction((client) =>
    publisherFor(schema).publish(client, QUEUE, { orderId: 7 }, { key: KEY, headers: { tenant: "acme ü" } }),
  );
  return { id, source, schema };
}

/** Calls `next` until it gives something other than null or false, and returns that. */
async function poll<T>(next: () => Promise<T | null | false>, what: string): Promise<T> {
  let value: T | null | false = null;
  await until(async () => {
    value = await next();
    return value !== null && value !== false;
  }, what);
  return value as T;
}

async function outboxEmpty(schema: string): Promise<boolean> {
  const { rows } = await db.pool.query(`SELECT count(*)::int AS n FROM "${schema}".messages`);
  return rows[0].n === 0;
}

interface Delivery {
  headers: http.IncomingHttpHeaders;
  body: string;
  status?: number;
  answer?: string;
  dropped: boolean;
}

/** A receiving node:http server using the inbox's webhook handler; `drop` decides which answers are lost. */
async function webhookReceiver(
  secret: string,
  options: { drop?: (n: number) => boolean; failFirst?: boolean } = {},
) {
  const deliveries: Delivery[] = [];
  let failed = false;
  const handler = createWebhookHandler(inbox, {
    signingSecret: secret,
    handler: async (event, client) => {
      await applyEffect(event, client);
      if (options.failFirst && !failed) {
        failed = true;
        throw new Error("the handler's downstream failed");
      }
    },
  });
  const server = http.createServer((req, res) => {
    const delivery: Delivery = { headers: req.headers, body: "", dropped: false };
    deliveries.push(delivery);
    const chunks: Buffer[] = [];
    req.on("data", (chunk: Buffer) => chunks.push(chunk));
    req.on("end", () => {
      delivery.body = Buffer.concat(chunks).toString("utf8");
    });
    const end = res.end.bind(res);
    res.end = ((chunk?: unknown) => {
      // Called once inbox.handle returned: the handler's transaction has committed (or rolled back).
      delivery.status = res.statusCode;
      delivery.answer = typeof chunk === "string" ? chunk : String(chunk);
      if (options.drop?.(deliveries.length)) {
        delivery.dropped = true;
        req.socket.destroy(); // the answer is lost: the relay sees a network error and retries
        return res;
      }
      return end(chunk as string);
    }) as typeof res.end;
    handler(req, res);
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  cleanups.push(
    () =>
      new Promise((resolve) => {
        server.closeAllConnections();
        server.close(resolve);
      }),
  );
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/outbox`;
  return { deliveries, url };
}

const newSecret = () => `whsec_${randomBytes(32).toString("base64")}`;

describe("http: the webhook handler with the inbox", () => {
  it("a first answer lost after the commit: the relay delivers again, the effect exists once, the second answer says duplicate", async () => {
    const secret = newSecret();
    const { deliveries, url } = await webhookReceiver(secret, { drop: (n) => n === 1 });
    const sent = await relayOneOrder({ type: "http", url, signingSecret: secret });
    await until(() => outboxEmpty(sent.schema), "the message acked by the relay", 60_000);
    expect(deliveries.map((d) => [d.status, d.dropped, d.answer])).toEqual([
      [200, true, JSON.stringify({ id: sent.id, duplicate: false })],
      [200, false, JSON.stringify({ id: sent.id, duplicate: true })],
    ]);
    expect(await effectRows(sent.id, sent.source)).toBe(1);
    const { rows } = await db.pool.query(
      `SELECT subject FROM ${effects} WHERE event_id = $1 AND source = $2`,
      [sent.id, sent.source],
    );
    expect(rows).toEqual([{ subject: KEY }]);

    // Interop: the standardwebhooks package verifies what the relay sent.
    const first = deliveries[0] as Delivery;
    const flat = Object.fromEntries(
      Object.entries(first.headers).map(([name, value]) => [name, String(value)]),
    );
    expect(new Webhook(secret).verify(first.body, flat)).toEqual({ orderId: 7 });
  });

  it("a handler that fails rolls back its effect and its record (500): the relay's retry applies it once", async () => {
    const secret = newSecret();
    const { deliveries, url } = await webhookReceiver(secret, { failFirst: true });
    const sent = await relayOneOrder({ type: "http", url, signingSecret: secret });
    await until(() => outboxEmpty(sent.schema), "the message acked by the relay", 60_000);
    expect(deliveries.map((d) => d.status)).toEqual([500, 200]);
    expect(JSON.parse(deliveries[1]?.answer ?? "")).toEqual({ id: sent.id, duplicate: false });
    expect(await effectRows(sent.id, sent.source)).toBe(1);
  });

  describe("refusals: nothing is written", () => {
    const secret = newSecret();
    const key = signingKey(secret) as Buffer;
    const source = "/outbox/test/refusals";
    /** A request as the relay signs it (its own header and signing code), for id `id`. */
    function signed(id: string, timestamp = Math.floor(Date.now() / 1000)) {
      const body = JSON.stringify({ orderId: Number(id.replace(/\D/g, "")) });
      const message = fakeMessage({ id, queue: QUEUE, key: KEY, rawPayload: body });
      const headers: Record<string, string> = Object.fromEntries(
        httpRelayHeaders(message, { source, type: "{queue}" }, undefined),
      );
      headers["webhook-id"] = id;
      headers["webhook-timestamp"] = String(timestamp);
      headers["webhook-signature"] = webhookSignature([key], id, timestamp, body);
      return { headers, body };
    }
    async function post(url: string, request: { headers: Record<string, string>; body: string }) {
      const response = await fetch(url, { method: "POST", headers: request.headers, body: request.body });
      return { status: response.status, body: await response.text() };
    }
    async function written(id: string) {
      const { rows } = await db.pool.query(
        `SELECT (SELECT count(*) FROM "${receiver}".outbox_inbox WHERE event_id = $1 AND source = $2)::int
              + (SELECT count(*) FROM ${effects} WHERE event_id = $1 AND source = $2)::int AS n`,
        [id, source],
      );
      return rows[0].n;
    }

    it("a tampered body, signature or ce-id is refused; a replay too late (or from the future) too", async () => {
      const { url, deliveries } = await webhookReceiver(secret);
      const tamperedBody = signed("t-1");
      tamperedBody.body = tamperedBody.body.replace("1", "2");
      expect((await post(url, tamperedBody)).status).toBe(401);
      const tamperedSignature = signed("t-2");
      tamperedSignature.headers["webhook-signature"] = webhookSignature(
        [randomBytes(32)],
        "t-2",
        Number(tamperedSignature.headers["webhook-timestamp"]),
        tamperedSignature.body,
      );
      expect((await post(url, tamperedSignature)).status).toBe(401);
      const otherId = signed("t-3");
      otherId.headers["ce-id"] = "t-3x"; // unsigned header: the signed webhook-id must be the dedupe key
      expect(await post(url, otherId)).toMatchObject({ status: 400 });
      const stale = signed("t-4", Math.floor(Date.now() / 1000) - 301);
      expect(await post(url, stale)).toEqual({
        status: 401,
        body: JSON.stringify({ error: "signature refused: webhook-timestamp is too old" }),
      });
      const future = signed("t-5", Math.floor(Date.now() / 1000) + 301);
      expect((await post(url, future)).status).toBe(401);
      for (const id of ["t-1", "t-2", "t-3", "t-3x", "t-4", "t-5"]) expect(await written(id), id).toBe(0);
      expect(deliveries).toHaveLength(5);

      // The control: the same request untampered is handled, and what standardwebhooks signs verifies.
      expect(await post(url, signed("t-1"))).toEqual({
        status: 200,
        body: JSON.stringify({ id: "t-1", duplicate: false }),
      });
      const theirs = signed("t-6");
      const timestamp = new Date();
      theirs.headers["webhook-timestamp"] = String(Math.floor(timestamp.getTime() / 1000));
      theirs.headers["webhook-signature"] = new Webhook(secret).sign("t-6", timestamp, theirs.body);
      expect((await post(url, theirs)).status).toBe(200);
      expect(await written("t-6")).toBe(2);
    });
  });
});

describe("http: requests the webhook handler cannot take", () => {
  it("405 for a GET, 413 for a body over maxBodyBytes, 500 (saying why) when a body parser read the body first", async () => {
    const secret = newSecret();
    const handler = createWebhookHandler(inbox, {
      signingSecret: secret,
      maxBodyBytes: 64,
      handler: () => {},
    });
    const server = http.createServer((req, res) => {
      if (req.url === "/parsed") {
        // What express.json() does before a route: reads the stream to its end.
        req.resume();
        req.on("end", () => handler(req, res));
      } else handler(req, res);
    });
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    cleanups.push(() => new Promise((resolve) => server.close(resolve)));
    const base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    expect((await fetch(`${base}/`)).status).toBe(405);
    expect((await fetch(`${base}/`, { method: "POST", body: "x".repeat(65) })).status).toBe(413);
    const parsed = await fetch(`${base}/parsed`, { method: "POST", body: "{}" });
    expect(parsed.status).toBe(500);
    expect(await parsed.text()).toMatch(/before any body parser/);
  });
});

describe.skipIf(redisDown !== undefined)("redis: a relayed entry through the inbox", () => {
  it("read again before its XACK (a consumer crash), and added again as a relay redelivery adds it: effect once", async () => {
    const redis = new Redis({ host: HOST, port: REDIS_PORT, maxRetriesPerRequest: 1 });
    cleanups.push(async () => redis.disconnect());
    const stream = `inbox-test:${RUN}:${QUEUE}`;
    cleanups.push(() => redis.del(stream));
    await redis.xgroup("CREATE", stream, "billing", "0", "MKSTREAM");
    const sent = await relayOneOrder({ type: "redis", url: `redis://${HOST}:${REDIS_PORT}`, stream });
    const read = async (from: ">" | "0") =>
      (
        (await redis.xreadgroup(
          "GROUP",
          "billing",
          "c1",
          "COUNT",
          10,
          "BLOCK",
          200,
          "STREAMS",
          stream,
          from,
        )) as [string, [string, string[]][]][] | null
      )?.[0]?.[1] ?? [];
    const entries = await poll(async () => {
      const found = await read(">");
      return found.length > 0 ? found : null;
    }, "the relayed entry");
    const [entryId, fields] = entries[0] as [string, string[]];
    expect(await handleRedisEntry(inbox, fields, applyEffect)).toEqual({
      duplicate: false,
      result: undefined,
    });
    // No XACK: the consumer "crashed" after the commit. Its pending entry is read again.
    const pending = await read("0");
    expect(pending.map(([id]) => id)).toEqual([entryId]);
    expect(await handleRedisEntry(inbox, (pending[0] as [string, string[]])[1], applyEffect)).toEqual({
      duplicate: true,
    });
    await redis.xack(stream, "billing", entryId);
    // A relay redelivery XADDs the same event as a new entry.
    await redis.xadd(stream, "*", ...fields);
    const again = await read(">");
    expect(again).toHaveLength(1);
    expect(await handleRedisEntry(inbox, (again[0] as [string, string[]])[1], applyEffect)).toEqual({
      duplicate: true,
    });
    expect(await effectRows(sent.id, sent.source)).toBe(1);
  });
});

describe.skipIf(natsDown !== undefined)("nats: a relayed JetStream message through the inbox", () => {
  it("not acked, redelivered after the ack wait: effect once", async () => {
    const nc = await natsConnect({ servers: `${HOST}:${NATS_PORT}` });
    cleanups.push(() => nc.close());
    const stream = `INBOX_${RUN}`;
    cleanups.push(async () => (await nc.jetstreamManager()).streams.delete(stream));
    const sent = await relayOneOrder({
      type: "nats",
      servers: `nats://${HOST}:${NATS_PORT}`,
      subject: `inbox.${RUN}.{queue}`,
      stream,
    });
    await until(() => outboxEmpty(sent.schema), "the message relayed");
    const jsm = await nc.jetstreamManager();
    await jsm.consumers.add(stream, {
      durable_name: "billing",
      ack_policy: AckPolicy.Explicit,
      ack_wait: 1_000_000_000, // 1 s, in nanoseconds: the redelivery comes quickly
    });
    const consumer = await nc.jetstream().consumers.get(stream, "billing");
    const first = await consumer.next({ expires: 10_000 });
    if (first === null) throw new Error("no message from JetStream");
    expect(await handleNatsMessage(inbox, first, applyEffect)).toMatchObject({ duplicate: false });
    // Not acked (a crash between the commit and the ack): JetStream redelivers it after the ack wait.
    const redelivered = await poll(() => consumer.next({ expires: 2000 }), "the redelivery");
    expect(redelivered.redelivered).toBe(true);
    expect(await handleNatsMessage(inbox, redelivered, applyEffect)).toEqual({ duplicate: true });
    redelivered.ack();
    expect(await effectRows(sent.id, sent.source)).toBe(1);
  });
});

describe.skipIf(rabbitDown !== undefined)("rabbitmq: a relayed message through the inbox", () => {
  it("requeued before its ack, and redelivered after the channel closed unacked: effect once", async () => {
    const queue = `inbox-${RUN}`;
    const conn = await amqp.connect(RABBIT_URL);
    cleanups.push(() => conn.close());
    const admin = await conn.createChannel();
    cleanups.push(() => admin.deleteQueue(queue));
    const sent = await relayOneOrder({
      type: "rabbitmq",
      url: RABBIT_URL,
      exchange: "",
      routingKey: queue,
      declareQueue: queue,
    });
    const get = async (channel: amqp.Channel) => {
      return poll(() => channel.get(queue, { noAck: false }), "a message");
    };
    const channel = await conn.createChannel();
    const first = await get(channel);
    expect(await handleAmqpMessage(inbox, first, applyEffect)).toMatchObject({ duplicate: false });
    channel.nack(first, false, true); // requeued: as if the ack never came
    const second = await get(channel);
    expect(second.fields.redelivered).toBe(true);
    expect(await handleAmqpMessage(inbox, second, applyEffect)).toEqual({ duplicate: true });
    await channel.close(); // closed before the ack: the broker requeues it
    const other = await conn.createChannel();
    cleanups.push(() => other.close());
    const third = await get(other);
    expect(await handleAmqpMessage(inbox, third, applyEffect)).toEqual({ duplicate: true });
    other.ack(third);
    expect(await effectRows(sent.id, sent.source)).toBe(1);
  });
});
