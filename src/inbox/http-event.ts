import { decodeHeaderValue } from "../wire/header-encoding.js";
import { decodeStructured, eventFromAttributes, type InboxEvent, MalformedEventError } from "./event.js";

/** Request headers as node:http gives them (lower-case names), or any flat record of them. */
export type RequestHeaders = Record<string, string | string[] | undefined>;

const STRUCTURED = /^application\/cloudevents\+json\b/i;
const BATCH = /^application\/cloudevents-batch\+json\b/i;

/** One header's value: repeated ones joined as HTTP does (`, `). */
export function headerValue(headers: RequestHeaders, name: string): string | undefined {
  const value = headers[name];
  return Array.isArray(value) ? value.join(", ") : value;
}

/**
 * The CloudEvent of one HTTP request, per the CloudEvents HTTP binding: structured mode when the content
 * type is `application/cloudevents+json`, else binary mode (each attribute a `ce-*` header, its value
 * percent-decoded; `datacontenttype` the request's content type; the body the data, as it came). Throws
 * {@link MalformedEventError} naming the header at fault.
 */
export function decodeHttpEvent(headers: RequestHeaders, body: string): InboxEvent {
  const contentType = headerValue(headers, "content-type");
  const plain: Record<string, string> = {};
  const attributes: Record<string, string> = {};
  for (const [rawName, rawValue] of Object.entries(headers)) {
    const name = rawName.toLowerCase();
    const value = Array.isArray(rawValue) ? rawValue.join(", ") : rawValue;
    if (value === undefined) continue;
    if (name.startsWith("ce-")) {
      try {
        attributes[name.slice(3)] = decodeHeaderValue(value);
      } catch (error) {
        throw new MalformedEventError(name, (error as Error).message);
      }
    } else if (!name.startsWith("webhook-") && name !== "traceparent" && name !== "tracestate") {
      // The relay percent-encodes the message headers it sends as plain headers; HTTP's own headers are
      // not encoded, and one that does not decode is kept as it came.
      plain[name] = safeDecode(value);
    }
  }
  if (contentType !== undefined && BATCH.test(contentType)) {
    throw new MalformedEventError(
      "content-type",
      "batched mode is not supported: send one event per request",
    );
  }
  if (contentType !== undefined && STRUCTURED.test(contentType)) return decodeStructured(body, plain);
  if (contentType !== undefined) attributes.datacontenttype = contentType;
  if (attributes.specversion === undefined) {
    throw new MalformedEventError("ce-specversion", "missing: not a CloudEvent in binary mode");
  }
  return eventFromAttributes(attributes, body, plain);
}

function safeDecode(value: string): string {
  try {
    return decodeHeaderValue(value);
  } catch {
    return value;
  }
}

/** Thrown for a request whose body is not UTF-8 text; kept apart so the answer can be 400. */
export function decodeBody(bytes: Buffer): string {
  try {
    return new TextDecoder("utf-8", { fatal: true }).decode(bytes);
  } catch {
    throw new MalformedEventError("body", "is not UTF-8 text");
  }
}
