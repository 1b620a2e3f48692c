import { type CloudEvent, HTTP } from "cloudevents";
import type { MessageContext } from "../../src/contract/handler.js";
import { fakeMessage } from "./message.js";

/**
 * A message that exercises every CloudEvents attribute: a key needing escapes (space, percent, quote,
 * non-ASCII), trace context, a header that qualifies as an extension and one that does not, and a number
 * no double can hold (a re-serialised payload would round it).
 */
export function attributeMessage(id: string, queue: string, key: string | null): MessageContext {
  return fakeMessage({
    id,
    queue,
    key,
    headers: {
      traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
      tracestate: "vendor=a b",
      tenant: "acme corp",
      "x-tenant": "acme",
    },
    createdAt: new Date("2026-01-02T03:04:05.678Z"),
    rawPayload: '{"n":12345678901234567890,"s":"ü","a":[1, 2]}',
  });
}

export const AWKWARD_KEY = 'k ü€ %20 "q" 😀';

/** The attributes every broker must carry for `attributeMessage` (plus `datacontenttype` and `subject`). */
export function expectedAttributes(id: string, source: string, type: string): Record<string, string> {
  return {
    specversion: "1.0",
    id,
    source,
    type,
    time: "2026-01-02T03:04:05.678Z",
    traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    tracestate: "vendor=a b",
    tenant: "acme corp",
  };
}

/**
 * Percent-decoding as the NATS binding prescribes (§3.1.3.2): values are never double-quoted by this
 * relay, and `decodeURIComponent` rejects byte sequences invalid in UTF-8, as the binding requires.
 */
export function percentDecode(value: string): string {
  return decodeURIComponent(value);
}

/**
 * A binary-mode event through the SDK's HTTP binding (the SDK has none for NATS or AMQP 0-9-1): the
 * attributes become `ce-*` HTTP headers and `datacontenttype` the content type. The SDK validates it
 * (required attributes, specversion, time format, extension names).
 */
export function binaryToEvent(attributes: Record<string, string>, body: string): CloudEvent<unknown> {
  const headers: Record<string, string> = {};
  for (const [name, value] of Object.entries(attributes)) {
    headers[name === "datacontenttype" ? "content-type" : `ce-${name}`] = value;
  }
  const event = HTTP.toEvent({ headers, body });
  if (Array.isArray(event)) throw new Error("one event expected");
  return event as CloudEvent<unknown>;
}

/** A structured JSON event through the SDK, which validates it. */
export function structuredToEvent(body: string): CloudEvent<unknown> {
  const event = HTTP.toEvent({ headers: { "content-type": "application/cloudevents+json" }, body });
  if (Array.isArray(event)) throw new Error("one event expected");
  return event as CloudEvent<unknown>;
}

/**
 * The `data` member's exact text in a structured JSON event: the relay splices the stored payload in last,
 * so it runs from `"data":` to the closing brace. Checked against JSON.parse's view of the event so a
 * differently shaped event cannot pass by accident.
 */
export function rawDataOf(structured: string): string {
  const marker = ',"data":';
  const at = structured.lastIndexOf(marker);
  if (at < 0 || !structured.endsWith("}")) throw new Error("no trailing data member");
  return structured.slice(at + marker.length, -1);
}
