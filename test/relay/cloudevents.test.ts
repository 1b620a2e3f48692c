import { type CloudEvent, HTTP } from "cloudevents";
import { describe, expect, it } from "vitest";
import type { MessageContext } from "../../src/contract/handler.js";
import {
  binaryAttributes,
  cloudEventAttributes,
  defaultEventSource,
  isExtensionName,
  structuredEvent,
} from "../../src/relay/cloudevents.js";
import { fakeMessage } from "../support/message.js";

const createdAt = new Date("2026-12-01T10:20:30.456Z");

function message(overrides: Partial<MessageContext> = {}): MessageContext {
  return fakeMessage({
    id: "9007199254740993",
    queue: "order.placed",
    key: "customer 42 / ü",
    headers: {
      traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
      tracestate: "vendor=1",
      tenant: "acme",
      "x-request-id": "r-1",
    },
    createdAt,
    rawPayload: '{"total": 12345678901234567890, "items": ["a"]}',
    ...overrides,
  });
}

describe("CloudEvents attributes of an outbox message", () => {
  it("maps id, source, type with {queue}, subject = key, time = created, tracing, qualifying headers", () => {
    const a = cloudEventAttributes(message(), { source: "/outbox/app/outbox", type: "com.example.{queue}" });
    expect(a).toEqual({
      specversion: "1.0",
      id: "9007199254740993",
      source: "/outbox/app/outbox",
      type: "com.example.order.placed",
      subject: "customer 42 / ü",
      time: "2026-12-01T10:20:30.456Z",
      datacontenttype: "application/json",
      traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
      tracestate: "vendor=1",
      // `x-request-id` is not a valid attribute name: it stays out (each relay carries it its own way).
      extensions: { tenant: "acme" },
    });
  });

  it("types a subscriber's copy by its topic with {topic}, and a message sent to its queue by the queue", () => {
    const naming = { source: "/s", type: "{topic}" };
    const copy = message({ queue: "webhook", topic: "order.placed" });
    expect(cloudEventAttributes(copy, naming).type).toBe("order.placed");
    expect(cloudEventAttributes(message({ queue: "webhook" }), naming).type).toBe("webhook");
    expect(cloudEventAttributes(copy, { source: "/s", type: "x.{queue}.{topic}" }).type).toBe(
      "x.webhook.order.placed",
    );
  });

  it("leaves subject out for a keyless message", () => {
    const a = cloudEventAttributes(message({ key: null, headers: {} }), { source: "/s", type: "{queue}" });
    expect("subject" in a).toBe(false);
    expect(binaryAttributes(a).map(([name]) => name)).toEqual([
      "specversion",
      "id",
      "source",
      "type",
      "time",
    ]);
  });

  it("takes only lower-case letters and digits, up to 20, that CloudEvents does not define", () => {
    for (const ok of ["tenant", "region2", "a", "abcdefghijklmnopqrst"])
      expect(isExtensionName(ok)).toBe(true);
    for (const bad of ["Tenant", "x-tenant", "x_y", "", "abcdefghijklmnopqrstu", "id", "data", "subject"])
      expect(isExtensionName(bad)).toBe(false);
  });

  it("a structured event is valid for the cloudevents SDK and keeps the payload's digits", () => {
    const m = message();
    const text = structuredEvent(cloudEventAttributes(m, { source: "/s", type: "{queue}" }), m.rawPayload);
    expect(text).toContain('"data":{"total": 12345678901234567890, "items": ["a"]}');
    const event = HTTP.toEvent({
      headers: { "content-type": "application/cloudevents+json" },
      body: text,
    }) as CloudEvent<unknown>;
    expect(event.validate()).toBe(true);
    expect(event.id).toBe(m.id);
    expect(event.subject).toBe(m.key);
    expect(event.time).toBe("2026-12-01T10:20:30.456Z");
    expect(event.tenant).toBe("acme");
    expect(event.traceparent).toBe(m.headers.traceparent);
  });

  it("the default source names the database and schema, never the host, user or password", () => {
    expect(defaultEventSource("postgres://app:s3cret@db.internal:5432/shop?sslmode=require", "outbox")).toBe(
      "/outbox/shop/outbox",
    );
    expect(defaultEventSource("postgresql://db.internal", "outbox")).toBe("/outbox/outbox");
    expect(defaultEventSource("host=db user=app password=s3cret dbname=shop", "outbox")).toBe(
      "/outbox/outbox",
    );
  });
});
