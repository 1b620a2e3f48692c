import { randomBytes } from "node:crypto";
import http from "node:http";
import type { AddressInfo } from "node:net";
import { type CloudEventV1, HTTP } from "cloudevents";
import pino from "pino";
import { Webhook } from "standardwebhooks";
import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from "vitest";
import { OutboxConfigError } from "../../src/contract/errors.js";
import type { MessageContext } from "../../src/contract/handler.js";
import { classifyError, type ErrorClass } from "../../src/contract/handler-errors.js";
import { encodeHeaderValue } from "../../src/relay/cloudevents.js";
import { createRelay } from "../../src/relay/create-relay.js";
import { createHttpRelay } from "../../src/relay/http.js";
import { HOST } from "../support/brokers.js";
import { fakeMessage } from "../support/message.js";
import {
  expectDelivered,
  newIds,
  payloadOf,
  relayScenarios,
  trackRelays,
} from "../support/relay-scenarios.js";

const TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
/** A Standard Webhooks secret: whsec_ and 32 random bytes in base64. */
const newSecret = () => `whsec_${randomBytes(32).toString("base64")}`;

const BURST = 50;
const logger = pino({ level: process.env.RELAY_TEST_LOG ?? "silent" });

function context(id: string, queue: string, key: string | null = `k-${id}`): MessageContext {
  return fakeMessage({
    id,
    queue,
    key,
    headers: { traceparent: TRACEPARENT, "x-tenant": "acme" },
    rawPayload: JSON.stringify(payloadOf(id)),
  });
}

const { outcome, outcomes, burstThroughOutage } = relayScenarios(context);
const { relay, proxyTo, closeAfter } = trackRelays(logger);

interface Received {
  method: string;
  url: string;
  headers: http.IncomingHttpHeaders;
  /** The body's bytes as they arrived. */
  raw: Buffer;
  body: string;
}

/** The headers as a receiver library takes them: one string each. */
function flatHeaders(headers: http.IncomingHttpHeaders): Record<string, string> {
  const flat: Record<string, string> = {};
  for (const [name, value] of Object.entries(headers)) {
    if (value !== undefined) flat[name] = Array.isArray(value) ? value.join(", ") : value;
  }
  return flat;
}

/** What the cloudevents SDK makes of a request, as a receiver would parse it. */
function toEvent(request: Received): CloudEventV1<unknown> {
  const event = HTTP.toEvent({ headers: flatHeaders(request.headers), body: request.body });
  if (Array.isArray(event)) throw new Error("a batch, expected one event");
  return event;
}

/** A standardwebhooks verification as a receiver does it: the raw body and the headers as received. */
function verify(secret: string, request: Received): unknown {
  return new Webhook(secret).verify(request.body, flatHeaders(request.headers));
}

describe("http relay", () => {
  const received: Received[] = [];
  let respond: (req: Received, res: http.ServerResponse) => void = (_req, res) => res.writeHead(204).end();
  let server: http.Server;
  let port: number;

  beforeAll(async () => {
    server = http.createServer((req, res) => {
      const chunks: Buffer[] = [];
      req.on("data", (chunk: Buffer) => chunks.push(chunk));
      req.on("end", () => {
        const raw = Buffer.concat(chunks);
        const entry = {
          method: req.method ?? "",
          url: req.url ?? "",
          headers: req.headers,
          raw,
          body: raw.toString("utf8"),
        };
        received.push(entry);
        respond(entry, res);
      });
    });
    await new Promise<void>((resolve) => server.listen(0, HOST, resolve));
    port = (server.address() as AddressInfo).port;
  });
  afterEach(() => {
    vi.useRealTimers();
    received.length = 0;
    respond = (_req, res) => res.writeHead(204).end();
  });
  afterAll(async () => {
    server.closeAllConnections();
    await new Promise((resolve) => server.close(resolve));
  });

  const ceIds = (entries: Received[]) => entries.map((r) => String(r.headers["ce-id"]));

  it("delivers a burst of 50, each once, as CloudEvents signed per Standard Webhooks", async () => {
    const secret = newSecret();
    const sender = await relay({
      type: "http",
      url: `http://${HOST}:${port}/hook`,
      signingSecret: secret,
      headers: {
        authorization: "Bearer t0ken",
        "idempotency-key": "cannot override",
        "webhook-id": "cannot override",
        "ce-id": "cannot override",
        "content-type": "text/plain",
      },
    });
    const ids = newIds(BURST);
    const results = await outcomes(sender, ids, "orders.placed");
    expect([...results.values()].every((r) => r === "ok")).toBe(true);

    expectDelivered(ceIds(received), ids);
    for (const request of received) {
      const id = String(request.headers["ce-id"]);
      expect(request.method).toBe("POST");
      expect(request.url).toBe("/hook");
      expect(request.headers["content-type"]).toBe("application/json");
      expect(request.headers["idempotency-key"]).toBe(id);
      expect(request.headers["webhook-id"]).toBe(id);
      expect(request.headers["x-outbox-id"]).toBeUndefined();
      expect(request.headers.authorization).toBe("Bearer t0ken");
      expect(request.body).toBe(JSON.stringify(payloadOf(id)));
      expect(verify(secret, request)).toEqual(payloadOf(id));
      expect(toEvent(request)).toMatchObject({ id, type: "orders.placed", subject: `k-${id}` });
    }
  });

  it("sends every attribute the way the HTTP binding says, and the payload byte for byte", async () => {
    const awkwardKey = 'k ü€ %20 "q" 😀';
    const rawPayload = '{"n":12345678901234567890,"s":"ü","a":[1, 2]}';
    const headers = {
      traceparent: TRACEPARENT,
      tracestate: "vendor=a b",
      tenant: "acme corp",
      "x-tenant": "acme ü",
      "x-region": "eu west",
      "x-discount": "50%",
      "X-Request-Id": "r-1",
    };
    const createdAt = new Date("2026-01-02T03:04:05.678Z");
    const message = (id: string, key: string | null): MessageContext => ({
      ...context(id, "orders.placed", key),
      headers,
      createdAt,
      rawPayload,
    });
    const named = await createHttpRelay(
      { type: "http", url: `http://${HOST}:${port}/hook`, eventType: "com.example.{queue}.v1" },
      { logger, source: "/outbox/shop/public" },
    );
    closeAfter(named);
    const [keyed = "", keyless = ""] = newIds(2);
    await named.handler(JSON.parse(rawPayload), message(keyed, awkwardKey));
    await named.handler(JSON.parse(rawPayload), message(keyless, null));
    expect(received).toHaveLength(2);
    const [first, second] = received as [Received, Received];

    // The body is the stored JSON text itself: the 20-digit number is intact, nothing re-serialised.
    for (const request of received) expect(request.raw.equals(Buffer.from(rawPayload, "utf8"))).toBe(true);

    const event = toEvent(first);
    expect(event.specversion).toBe("1.0");
    expect(event.id).toBe(keyed);
    expect(event.source).toBe("/outbox/shop/public");
    expect(event.type).toBe("com.example.orders.placed.v1");
    expect(event.time).toBe("2026-01-02T03:04:05.678Z");
    expect(event.datacontenttype).toBe("application/json");
    // The SDK (v10) does not undo the binding's percent-encoding: a receiver decodes the values itself.
    expect(first.headers["ce-subject"]).toBe("k%20%C3%BC%E2%82%AC%20%2520%20%22q%22%20%F0%9F%98%80");
    expect(decodeURIComponent(String(event.subject))).toBe(awkwardKey);
    expect(event.traceparent).toBe(TRACEPARENT);
    expect(decodeURIComponent(String(event.tracestate))).toBe("vendor=a b");
    expect(decodeURIComponent(String(event.tenant))).toBe("acme corp");
    // Trace context also as the W3C headers, for HTTP tracing middleware.
    expect(first.headers.traceparent).toBe(TRACEPARENT);
    expect(first.headers.tracestate).toBe("vendor=a b");
    // Headers that cannot be extension attributes arrive as plain headers: as they are where HTTP carries
    // them; a value with non-ASCII (or a `%`, which a decoding receiver would read as an escape) encoded the
    // ce- way, so decoding restores each exactly.
    expect(first.headers["x-region"]).toBe("eu west");
    expect(first.headers["x-tenant"]).toBe("acme%20%C3%BC");
    expect(decodeURIComponent(String(first.headers["x-tenant"]))).toBe("acme ü");
    expect(decodeURIComponent(String(first.headers["x-discount"]))).toBe("50%");
    expect(first.headers["x-request-id"]).toBe("r-1");
    expect(event["x-tenant"]).toBeUndefined();
    // No attribute is left out, and none invented.
    const ceHeaders = Object.keys(first.headers)
      .filter((name) => name.startsWith("ce-"))
      .sort();
    expect(ceHeaders).toEqual(
      ["id", "source", "specversion", "subject", "tenant", "time", "traceparent", "tracestate", "type"]
        .map((name) => `ce-${name}`)
        .sort(),
    );

    const keylessEvent = toEvent(second);
    expect(keylessEvent.id).toBe(keyless);
    expect(keylessEvent.subject).toBeUndefined();
    expect(second.headers["ce-subject"]).toBeUndefined();
    // Unsigned without signingSecret.
    expect(second.headers["webhook-signature"]).toBeUndefined();
  });

  it("names the source from the config, else the caller, else /outbox", async () => {
    const url = `http://${HOST}:${port}/hook`;
    const bySource = async (config: { eventSource?: string }, source: string | undefined) => {
      const created = await createHttpRelay({ type: "http", url, ...config }, { logger, source });
      closeAfter(created);
      const [id = ""] = newIds(1);
      await created.handler({}, context(id, "q"));
      return received.find((r) => r.headers["ce-id"] === id)?.headers["ce-source"];
    };
    expect(await bySource({ eventSource: "urn:shop" }, "/outbox/db/s")).toBe("urn:shop");
    expect(await bySource({}, "/outbox/db/s")).toBe("/outbox/db/s");
    expect(await bySource({}, undefined)).toBe("/outbox");
  });

  it("encodes header values per the binding: printable ASCII stays, the rest is UTF-8 percent-encoded", () => {
    expect(encodeHeaderValue("Euro € 😀")).toBe("Euro%20%E2%82%AC%20%F0%9F%98%80");
    expect(encodeHeaderValue('a"b%c d')).toBe("a%22b%25c%20d");
    expect(encodeHeaderValue("tab\there\r\n\u0000\u007f")).toBe("tab%09here%0D%0A%00%7F");
    expect(encodeHeaderValue("!#$&'()*+,-./09:;<=>?@AZ[\\]^_`az{|}~")).toBe(
      "!#$&'()*+,-./09:;<=>?@AZ[\\]^_`az{|}~",
    );
  });

  it("signs with every secret while one is rotated: each verifies alone, a stranger's does not", async () => {
    const [oldSecret, newSecret_, stranger] = [newSecret(), newSecret(), newSecret()];
    const rotating = await relay({
      type: "http",
      url: `http://${HOST}:${port}/hook`,
      signingSecret: [oldSecret, newSecret_],
    });
    const [id = ""] = newIds(1);
    expect(await outcome(rotating, id, "q")).toBe("ok");
    const [request] = received as [Received];
    const signatures = String(request.headers["webhook-signature"]).split(" ");
    expect(signatures).toHaveLength(2);
    for (const signature of signatures) expect(signature).toMatch(/^v1,[A-Za-z0-9+/]{43}=$/);
    expect(verify(oldSecret, request)).toEqual(payloadOf(id));
    expect(verify(newSecret_, request)).toEqual(payloadOf(id));
    expect(() => verify(stranger, request)).toThrow(/No matching signature/);
    // Bound to the id and the body: neither can be swapped under the same signature.
    const tampered = { ...request, body: request.body.replace("12.5", "99.5") };
    expect(() => verify(oldSecret, tampered)).toThrow(/No matching signature/);
    const otherId = { ...request, headers: { ...request.headers, "webhook-id": "1" } };
    expect(() => verify(oldSecret, otherId)).toThrow(/No matching signature/);
  });

  it("a request replayed outside the receiver's tolerance (5 minutes) is refused; a retry is signed anew", async () => {
    const secret = newSecret();
    const signed = await relay({ type: "http", url: `http://${HOST}:${port}/hook`, signingSecret: secret });
    const [id = ""] = newIds(1);
    const before = Math.floor(Date.now() / 1000);
    expect(await outcome(signed, id, "q")).toBe("ok");
    const [request] = received as [Received];
    const sentAt = Number(request.headers["webhook-timestamp"]);
    // Stamped while it was sent: between the call and its answer (whole seconds).
    expect(sentAt).toBeGreaterThanOrEqual(before);
    expect(sentAt).toBeLessThanOrEqual(Math.ceil(Date.now() / 1000));

    // Only Date is faked: sockets and timers keep running.
    vi.useFakeTimers({ toFake: ["Date"] });
    vi.setSystemTime((sentAt + 4 * 60) * 1000);
    expect(verify(secret, request)).toEqual(payloadOf(id));
    vi.setSystemTime((sentAt + 6 * 60) * 1000);
    expect(() => verify(secret, request)).toThrow(/too old/);

    // The same message sent again now carries the new time and verifies.
    expect(await outcome(signed, id, "q")).toBe("ok");
    const retry = received[1] as Received;
    expect(Number(retry.headers["webhook-timestamp"])).toBe(sentAt + 6 * 60);
    expect(verify(secret, retry)).toEqual(payloadOf(id));
  });

  it("refuses a message header it cannot send as it is, naming it, and sends nothing", async () => {
    const plain = await relay({
      type: "http",
      url: `http://${HOST}:${port}/hook`,
      headers: { "x-api-key": "k" },
    });
    const cases: Array<[string, RegExp]> = [
      ["content-type", /"content-type" \(it would change how the request is read\)/],
      ["ce-id", /"ce-id" \(a receiver would read it as a CloudEvents attribute\)/],
      ["webhook-id", /"webhook-id" \(Standard Webhooks reserves/],
      ["idempotency-key", /"idempotency-key" \(the relay sets that header itself\)/],
      ["x-api-key", /"x-api-key" \(the relay config sets that header\)/],
      ["bad name", /"bad name" \(not a valid HTTP header name\)/],
    ];
    for (const [name, reason] of cases) {
      const [id = ""] = newIds(1);
      const message = { ...context(id, "q"), headers: { [name]: "v", "x-fine": "ok" } };
      const error = await Promise.resolve(plain.handler({}, message)).then(
        () => undefined,
        (e: unknown) => e as Error,
      );
      expect(classifyError(error), name).toBe("permanent");
      expect(error?.message, name).toMatch(reason);
    }
    expect(received).toEqual([]);
  });

  it("refuses an old config with hmacSecret at start, naming signingSecret, and bad secrets without echoing them", async () => {
    const old = createRelay(
      { type: "http", url: `http://${HOST}:${port}/hook`, hmacSecret: "an-old-shared-secret-0123" },
      { logger },
    );
    await expect(old).rejects.toBeInstanceOf(OutboxConfigError);
    const message = await old.catch((error: Error) => error.message);
    expect(message).toMatch(/relay\.hmacSecret: was replaced by signingSecret \(Standard Webhooks/);
    expect(message).not.toContain("an-old-shared-secret-0123");

    const short = `whsec_${randomBytes(16).toString("base64")}`;
    for (const signingSecret of [
      "plain-text-secret-of-some-length",
      short,
      [newSecret(), "whsec_not base64!!"],
    ]) {
      const bad = await createRelay(
        { type: "http", url: `http://${HOST}:${port}/h`, signingSecret },
        { logger },
      ).catch((error: Error) => error);
      expect(bad).toBeInstanceOf(OutboxConfigError);
      const text = (bad as Error).message;
      expect(text).toMatch(/relay\.signingSecret(\.1)?: must be a Standard Webhooks secret/);
      for (const secret of [signingSecret].flat()) expect(text).not.toContain(secret.slice(6, 20));
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
      const status = statusFor.get(String(req.headers["ce-id"])) ?? 500;
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
    // The answer comes after 3 s, a 204 the relay would count as ok: "transient" is its 300 ms timeout.
    expect(await outcome(slow, id, "q")).toBe("transient");

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
    expectDelivered(ceIds(received), ids, lostAcks);
  });
});
