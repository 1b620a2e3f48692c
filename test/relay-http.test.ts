import { createHmac, timingSafeEqual } from "node:crypto";
import http from "node:http";
import type { AddressInfo } from "node:net";
import pino from "pino";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import type { MessageContext } from "../src/contract/handler.js";
import { classifyError, type ErrorClass } from "../src/contract/handler-errors.js";
import { createRelay } from "../src/relay/create-relay.js";
import type { Relay } from "../src/relay/relay.js";
import { HOST } from "./helpers/brokers.js";
import { startTcpProxy, type TcpProxy } from "./helpers/tcp-proxy.js";

const BURST = 50;
const logger = pino({ level: process.env.RELAY_TEST_LOG ?? "silent" });

let nextId = BigInt(Date.now()) * 1000n;
function newIds(count: number): string[] {
  return Array.from({ length: count }, () => String(nextId++));
}

function context(id: string, queue: string, key: string | null = `k-${id}`): MessageContext {
  return {
    id,
    queue,
    key,
    headers: { traceparent: `00-${id}`, "x-tenant": "acme" },
    deliveries: 1,
    attempts: 0,
    createdAt: new Date(),
    rawPayload: JSON.stringify(payloadOf(id)),
    signal: new AbortController().signal,
  };
}

const payloadOf = (id: string) => ({ orderId: id, total: 12.5, items: ["a", "b"] });

/** How one handler call ended: "ok", or how the worker would classify its error. */
async function outcome(relay: Relay, id: string, queue: string): Promise<"ok" | ErrorClass> {
  try {
    await relay.handler(payloadOf(id), context(id, queue));
    return "ok";
  } catch (error) {
    return classifyError(error);
  }
}

async function outcomes(relay: Relay, ids: string[], queue: string): Promise<Map<string, "ok" | ErrorClass>> {
  const results = await Promise.all(ids.map(async (id) => [id, await outcome(relay, id, queue)] as const));
  return new Map(results);
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** Retry the ids until each is accepted; every failure on the way must be transient. Bounded in time. */
async function retryUntilDelivered(relay: Relay, ids: string[], queue: string, timeoutMs = 20_000) {
  const deadline = Date.now() + timeoutMs;
  let pending = ids;
  const failures = new Set<ErrorClass>();
  for (let round = 0; pending.length > 0 && Date.now() < deadline && round < 500; round++) {
    const results = await outcomes(relay, pending, queue);
    pending = pending.filter((id) => results.get(id) !== "ok");
    for (const result of results.values()) if (result !== "ok") failures.add(result);
    if (pending.length > 0) await sleep(200);
  }
  expect(pending, "ids still failing after the broker came back").toEqual([]);
  expect(
    [...failures].filter((f) => f !== "transient"),
    "failures while recovering",
  ).toEqual([]);
}

/**
 * The outage scenario shared by every broker. 20 messages are delivered; 10 more reach the broker but
 * their acks are held back when the proxy cuts every connection (the at-least-once case: stored, yet
 * reported failed); 20 more are sent during the outage; then the proxy comes back and every failed id is
 * retried. `landed` counts what the broker has stored. Returns the ids whose acks were lost.
 */
async function burstThroughOutage(
  relay: Relay,
  proxy: TcpProxy,
  ids: string[],
  queue: string,
  landed: () => Promise<number>,
): Promise<Set<string>> {
  const before = await outcomes(relay, ids.slice(0, 20), queue);
  expect([...before.values()], "deliveries before the outage").toEqual(ids.slice(0, 20).map(() => "ok"));

  proxy.holdReplies();
  const inFlight = outcomes(relay, ids.slice(20, 30), queue);
  const deadline = Date.now() + 5000;
  while ((await landed()) < 30 && Date.now() < deadline) await sleep(20);
  expect(await landed(), "messages stored while their acks are held back").toBe(30);
  proxy.cut();
  const lostAcks = await inFlight;
  expect([...lostAcks.values()], "calls whose ack was lost").toEqual(
    ids.slice(20, 30).map(() => "transient"),
  );

  // No settling pause: cut() has destroyed every socket and refuses new ones, so no call from here on can
  // land, and each must fail as transient whether or not the client library has noticed the drop yet.
  const during = await outcomes(relay, ids.slice(30), queue);
  expect([...during.values()], "calls during the outage").toEqual(ids.slice(30).map(() => "transient"));

  proxy.restore();
  await retryUntilDelivered(relay, ids.slice(20), queue);
  return new Set(ids.slice(20, 30));
}

/** Each id exactly once, except `twice`: exactly two copies of those. */
function expectDelivered(delivered: string[], ids: string[], twice: ReadonlySet<string> = new Set()) {
  const counts = new Map<string, number>();
  for (const id of delivered) counts.set(id, (counts.get(id) ?? 0) + 1);
  expect([...counts.keys()].sort()).toEqual([...ids].sort());
  const wrong = [...counts].filter(([id, n]) => n !== (twice.has(id) ? 2 : 1));
  expect(wrong, "ids delivered a wrong number of times [id, copies]").toEqual([]);
}

/** Relays and proxies made in a test are closed after it, even when it fails. */
const relays: Relay[] = [];
const proxies: TcpProxy[] = [];
afterEach(async () => {
  await Promise.all(relays.splice(0).map((r) => r.close()));
  await Promise.all(proxies.splice(0).map((p) => p.close()));
});

async function relay(config: Parameters<typeof createRelay>[0]): Promise<Relay> {
  const created = await createRelay(config, { logger });
  relays.push(created);
  return created;
}

async function proxyTo(port: number): Promise<TcpProxy> {
  const proxy = await startTcpProxy({ host: HOST, port });
  proxies.push(proxy);
  return proxy;
}

interface Received {
  method: string;
  url: string;
  headers: http.IncomingHttpHeaders;
  body: string;
}

describe("http relay", () => {
  const SECRET = "a-shared-secret-of-32-characters";
  const received: Received[] = [];
  let respond: (req: Received, res: http.ServerResponse) => void = (_req, res) => res.writeHead(204).end();
  let server: http.Server;
  let port: number;

  beforeAll(async () => {
    server = http.createServer((req, res) => {
      const chunks: Buffer[] = [];
      req.on("data", (chunk: Buffer) => chunks.push(chunk));
      req.on("end", () => {
        const entry = {
          method: req.method ?? "",
          url: req.url ?? "",
          headers: req.headers,
          body: Buffer.concat(chunks).toString("utf8"),
        };
        received.push(entry);
        respond(entry, res);
      });
    });
    await new Promise<void>((resolve) => server.listen(0, HOST, resolve));
    port = (server.address() as AddressInfo).port;
  });
  afterEach(() => {
    received.length = 0;
    respond = (_req, res) => res.writeHead(204).end();
  });
  afterAll(async () => {
    server.closeAllConnections();
    await new Promise((resolve) => server.close(resolve));
  });

  const bodyIds = (entries: Received[]) => entries.map((r) => (JSON.parse(r.body) as { id: string }).id);

  it("delivers a burst of 50, each once, signed and with the id headers", async () => {
    const http = await relay({
      type: "http",
      url: `http://${HOST}:${port}/hook`,
      hmacSecret: SECRET,
      headers: { authorization: "Bearer t0ken", "x-outbox-id": "cannot override" },
    });
    const ids = newIds(BURST);
    const results = await outcomes(http, ids, "orders.placed");
    expect([...results.values()].every((r) => r === "ok")).toBe(true);

    expectDelivered(bodyIds(received), ids);
    for (const request of received) {
      const body = JSON.parse(request.body) as Record<string, unknown>;
      expect(request.method).toBe("POST");
      expect(request.url).toBe("/hook");
      expect(request.headers["content-type"]).toBe("application/json");
      expect(request.headers["x-outbox-id"]).toBe(body.id);
      expect(request.headers["idempotency-key"]).toBe(body.id);
      expect(request.headers.authorization).toBe("Bearer t0ken");
      expect(body).toMatchObject({
        queue: "orders.placed",
        key: `k-${body.id}`,
        headers: { traceparent: `00-${body.id}`, "x-tenant": "acme" },
        payload: payloadOf(String(body.id)),
      });
      expect(new Date(String(body.createdAt)).toISOString()).toBe(body.createdAt);

      const signature = String(request.headers["x-outbox-signature"]);
      expect(signature).toMatch(/^sha256=[0-9a-f]{64}$/);
      const expected = createHmac("sha256", SECRET).update(request.body).digest();
      expect(timingSafeEqual(Buffer.from(signature.slice("sha256=".length), "hex"), expected)).toBe(true);
    }
  });

  it("classifies answers: 422 permanent, 429 and 503 transient, with status and a short body snippet", async () => {
    const http = await relay({
      type: "http",
      url: `http://${HOST}:${port}/hook?token=s3cr3t`,
      method: "PUT",
    });
    const statusFor = new Map<string, number>();
    respond = (req, res) => {
      const status = statusFor.get(String(req.headers["x-outbox-id"])) ?? 500;
      res.writeHead(status, { "content-type": "text/plain" }).end(`refused:\n${"x".repeat(1000)}`);
    };
    const cases: Array<[number, ErrorClass]> = [
      [422, "permanent"],
      [400, "permanent"],
      [404, "permanent"],
      [408, "transient"],
      [429, "transient"],
      [503, "transient"],
      [500, "transient"],
      [302, "transient"],
    ];
    for (const [status, expected] of cases) {
      const [id = ""] = newIds(1);
      statusFor.set(id, status);
      const error = await Promise.resolve(http.handler({}, context(id, "q"))).then(
        () => undefined,
        (e: unknown) => e as Error,
      );
      expect(error, `status ${status}`).toBeInstanceOf(Error);
      expect(classifyError(error), `status ${status}`).toBe(expected);
      expect(error?.message).toContain(`PUT http://${HOST}:${port}/hook?… answered ${status}`);
      expect(error?.message).not.toContain("s3cr3t");
      if (status !== 302) expect(error?.message).toContain("refused: xxx");
      expect(error?.message.length).toBeLessThan(320);
    }
    expect(received.every((r) => r.method === "PUT")).toBe(true);
  });

  it("treats a timeout and a refused connection as transient", async () => {
    respond = (_req, res) => void setTimeout(() => res.writeHead(204).end(), 3000);
    const slow = await relay({ type: "http", url: `http://${HOST}:${port}/slow`, timeoutMs: 300 });
    const [id = ""] = newIds(1);
    const started = Date.now();
    expect(await outcome(slow, id, "q")).toBe("transient");
    expect(Date.now() - started).toBeLessThan(2500);

    const proxy = await proxyTo(port);
    proxy.cut();
    const refused = await relay({ type: "http", url: `http://${HOST}:${proxy.port}/hook` });
    expect(await outcome(refused, id, "q")).toBe("transient");
  });

  it("loses nothing when the connection is cut mid-burst", async () => {
    respond = (_req, res) => void setTimeout(() => res.writeHead(200).end("ok"), 5);
    const proxy = await proxyTo(port);
    const http = await relay({ type: "http", url: `http://${HOST}:${proxy.port}/hook`, timeoutMs: 2000 });
    const ids = newIds(BURST);
    const lostAcks = await burstThroughOutage(http, proxy, ids, "q", async () => received.length);
    expectDelivered(bodyIds(received), ids, lostAcks);
  });
});
