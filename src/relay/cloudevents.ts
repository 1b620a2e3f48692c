import type { MessageContext } from "../contract/handler.js";
import { encodeHeaderValue } from "../wire/header-encoding.js";
import { QUEUE_PLACEHOLDER, TOPIC_PLACEHOLDER } from "./config.js";

// Shared with the consumer inbox, which decodes what the relays encode.
export { encodeHeaderValue };

/**
 * CloudEvents 1.0 context attributes of one outbox message, transport-neutral: each relay maps them with
 * its transport's protocol binding (binary content mode where the transport has a binding, structured
 * mode where it has none). The event data is always the payload's stored JSON text, byte for byte.
 */
export interface CloudEventAttributes {
  specversion: "1.0";
  /** The outbox id: unique per source, and the same on every redelivery (consumers dedupe by it). */
  id: string;
  source: string;
  type: string;
  /** The message's key, when it has one. */
  subject?: string;
  /** The row's creation time, RFC 3339 (UTC, milliseconds). */
  time: string;
  datacontenttype: "application/json";
  /** Distributed tracing extension: the W3C trace context the message carries in its headers. */
  traceparent?: string;
  tracestate?: string;
  /** The message's other headers whose names are valid extension attribute names (see {@link isExtensionName}). */
  extensions: Record<string, string>;
}

/** How a relay names its events. */
export interface CloudEventNaming {
  /** `source`: a URI-reference naming the producer (the service: `/outbox/<database>/<schema>`). */
  source: string;
  /** `type`; `{queue}` is replaced by the message's queue. */
  type: string;
}

/**
 * A relay's naming: its config's `eventSource`, else the caller's (the service names its database and
 * schema), else {@link DEFAULT_SOURCE}; its config's `eventType`.
 */
export function eventNaming(
  config: { eventSource?: string | undefined; eventType: string },
  deps: { source?: string | undefined },
): CloudEventNaming {
  return { source: config.eventSource ?? deps.source ?? DEFAULT_SOURCE, type: config.eventType };
}

/** The `source` when neither the relay config nor the caller names one. */
export const DEFAULT_SOURCE = "/outbox";
/** The `type` when the relay config names none: the queue's name. */
export const DEFAULT_TYPE = QUEUE_PLACEHOLDER;

/** Attribute names CloudEvents defines (core and the tracing extension): a header cannot take them. */
const RESERVED = new Set([
  "specversion",
  "id",
  "source",
  "type",
  "subject",
  "time",
  "datacontenttype",
  "dataschema",
  "data",
  "data_base64",
  "traceparent",
  "tracestate",
]);

/**
 * CloudEvents 1.0 §3.1.1: attribute names are lower-case ASCII letters and digits only, and SHOULD be at
 * most 20 characters (longer ones break some transports' header limits). A header named otherwise (say
 * `x-tenant`) cannot be an extension attribute: it travels in the transport's own headers where the
 * relay has them (see each relay), not in the event.
 */
export function isExtensionName(name: string): boolean {
  return /^[a-z0-9]{1,20}$/.test(name) && !RESERVED.has(name);
}

/** A message header that becomes an attribute of the event: the trace context, or a valid extension name. */
export function isEventAttribute(name: string): boolean {
  return name === "traceparent" || name === "tracestate" || isExtensionName(name);
}

/** The message as a CloudEvent's context attributes. */
export function cloudEventAttributes(
  message: MessageContext,
  naming: CloudEventNaming,
): CloudEventAttributes {
  const attributes: CloudEventAttributes = {
    specversion: "1.0",
    id: message.id,
    source: naming.source,
    // A subscriber's copy is typed by its topic (order.placed), not by the queue that relays it.
    type: naming.type
      .replaceAll(TOPIC_PLACEHOLDER, message.topic ?? message.queue)
      .replaceAll(QUEUE_PLACEHOLDER, message.queue),
    time: message.createdAt.toISOString(),
    datacontenttype: "application/json",
    extensions: {},
  };
  if (message.key !== null) attributes.subject = message.key;
  for (const [name, value] of Object.entries(message.headers)) {
    if (name === "traceparent" || name === "tracestate") attributes[name] = value;
    else if (isExtensionName(name)) attributes.extensions[name] = value;
  }
  return attributes;
}

/**
 * Every attribute but `datacontenttype` as [name, value] pairs, in a stable order: what a binary-mode
 * binding writes as prefixed headers (the content type goes in the transport's own content-type field).
 */
export function binaryAttributes(attributes: CloudEventAttributes): [string, string][] {
  const { datacontenttype: _, extensions, ...core } = attributes;
  const pairs: [string, string][] = [];
  for (const [name, value] of Object.entries(core)) if (value !== undefined) pairs.push([name, value]);
  for (const [name, value] of Object.entries(extensions)) pairs.push([name, value]);
  return pairs;
}

/**
 * The event in structured content mode (JSON event format): one JSON object holding every attribute and
 * `data`, the payload's stored JSON text spliced in byte for byte (a re-serialised payload would round
 * numbers beyond 2^53).
 */
export function structuredEvent(attributes: CloudEventAttributes, rawPayload: string): string {
  const { extensions, ...core } = attributes;
  const head = JSON.stringify({ ...core, ...extensions });
  return `${head.slice(0, -1)},"data":${rawPayload}}`;
}

/**
 * The service's `source` for a database and schema: `/outbox/<database>/<schema>` (the database from a
 * postgres:// URL; left out when the connection string names none). Never the host or the user.
 */
export function defaultEventSource(connection: string, schema: string): string {
  let database = "";
  try {
    const url = new URL(connection);
    if (/^postgres(ql)?:$/.test(url.protocol)) database = decodeURIComponent(url.pathname.slice(1));
  } catch {
    // A keyword/value connection string: name the schema only.
  }
  return `${DEFAULT_SOURCE}/${[database, schema]
    .filter((part) => part !== "")
    .map(encodeURIComponent)
    .join("/")}`;
}
