/**
 * What each built-in relay puts on the wire, for the AsyncAPI document. The header names are not restated
 * here: they are read off the relays' own header functions (httpRelayHeaders, natsEventHeaders,
 * rabbitmqEventHeaders, redisEventFields) run on sample messages, so the document follows the code. Only
 * the few names a relay sets inline (signing headers, Nats-Msg-Id, AMQP properties) are listed by hand,
 * and test/project/consumer-examples.test.ts checks those against messages the relays really send.
 */
import { OutboxError } from "../contract/errors.js";
import type { MessageContext } from "../contract/handler.js";
import {
  type CloudEventNaming,
  cloudEventAttributes,
  defaultEventSource,
  eventNaming,
  structuredEvent,
} from "../relay/cloudevents.js";
import { type RelayConfig, renderTarget, TOPIC_PLACEHOLDER } from "../relay/config.js";
import { redactConnectionString } from "../util/redact.js";
import type { JsonSchema } from "./json-schema.js";

/** One header (or entry field) a relay sends. */
export interface HeaderDescription {
  name: string;
  /** Sent on every message; else only when the message has what it carries (a key, a trace context). */
  required: boolean;
  description: string;
  /** The value, when it is the same on every message of the channel. */
  const?: string;
}

/** Where and how one queue's messages go. */
export interface TransportDescription {
  kind: RelayConfig["type"];
  /** The AsyncAPI server: protocol and host:port only (never user info or a query string). */
  servers: { protocol: string; host: string; pathname?: string }[];
  /** The channel address: URL path, subject, routing key or stream key. */
  address: string;
  contentType: string;
  /** CloudEvents content mode: binary (attributes as headers) or structured (one JSON event). */
  mode: "binary" | "structured";
  headers: HeaderDescription[];
  /** What other headers or fields may appear (extensions, message headers that are not attributes). */
  otherHeaders: string;
  /** The message payload when it is not the bare event data (structured mode: the event around it). */
  wrapPayload?: (data: JsonSchema) => JsonSchema;
  bindings: {
    channel?: Record<string, unknown>;
    operation?: Record<string, unknown>;
    message?: Record<string, unknown>;
  };
  description: string;
}

/** Where the `source` comes from when the relay config names none: the service's database and schema. */
export interface SourceContext {
  databaseUrl?: string | undefined;
  schema: string;
}

/** Stands for any message header that is not an attribute: left out of the names, like extensions. */
const SAMPLE_PLAIN = "x-sample";
const SAMPLE_TRACE = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

function sampleMessage(queue: string, full: boolean): MessageContext {
  return {
    id: "1",
    queue,
    topic: null,
    key: full ? "k" : null,
    // A plain header too: the redis relay writes its `headers` field only for such headers.
    headers: full ? { traceparent: SAMPLE_TRACE, tracestate: "a=b", [SAMPLE_PLAIN]: "v" } : {},
    deliveries: 1,
    attempts: 0,
    createdAt: new Date(0),
    rawPayload: "{}",
    signal: new AbortController().signal,
    publish: () => {},
  } as MessageContext;
}

/** Header names the relay's own function writes for a keyless, traceless message and for a full one. */
function headerNames(queue: string, names: (message: MessageContext) => Iterable<string>) {
  const always = new Set([...names(sampleMessage(queue, false))].map((n) => n.toLowerCase()));
  const sometimes = [...names(sampleMessage(queue, true))]
    .map((n) => n.toLowerCase())
    .filter((n) => !always.has(n) && n !== SAMPLE_PLAIN);
  return { always: [...always], sometimes: [...new Set(sometimes)] };
}

const ATTRIBUTE_MEANING: Record<string, string> = {
  id: "the outbox message id: the same on every redelivery, so consumers dedupe by it",
  source: "the producer (`/outbox/<database>/<schema>` unless the relay sets eventSource)",
  type: "the event type (the relay's eventType: by default the topic a subscriber's copy was published to, else the queue)",
  specversion: "CloudEvents version",
  time: "when the message was written (RFC 3339, UTC, milliseconds)",
  subject: "the message's ordering key (absent when keyless)",
  datacontenttype: "the data's media type",
  traceparent: "W3C trace context the message carries",
  tracestate: "W3C trace state the message carries",
};

/** A description for each name the relays write; a name missing here fails the describe tests. */
export function describeHeader(name: string): string {
  if (name.startsWith("ce-")) {
    const meaning = ATTRIBUTE_MEANING[name.slice(3)];
    if (meaning !== undefined) return `CloudEvents attribute ${name.slice(3)}: ${meaning}`;
  }
  const meaning = OTHER_MEANING[name] ?? ATTRIBUTE_MEANING[name];
  if (meaning !== undefined) return meaning;
  throw new OutboxError(`no description for relay header "${name}": add it to src/describe/transports.ts`);
}

const OTHER_MEANING: Record<string, string> = {
  "content-type": "the data's media type (binary mode: the body is the payload's JSON text)",
  "Content-Type": "structured mode: application/cloudevents+json; charset=utf-8 (the body is the event)",
  "idempotency-key": "the outbox message id (as ce-id)",
  "webhook-id": "Standard Webhooks: the outbox message id",
  "webhook-timestamp": "Standard Webhooks: the send time, unix seconds (new on every attempt)",
  "webhook-signature":
    'Standard Webhooks: `v1,<base64 HMAC-SHA256 of "<webhook-id>.<webhook-timestamp>.<body>">`, one per signing secret, space-separated',
  // Spelled as on the wire: NATS header names are case-sensitive, and JetStream reads this spelling.
  "Nats-Msg-Id": "the outbox message id: JetStream drops a repeat within the stream's duplicate window",
  id: "the outbox message id (= the event's id): dedupe by it",
  type: "the event's type",
  subject: "the message's ordering key (= the event's subject); absent when keyless",
  headers:
    "JSON object of the message headers that cannot be CloudEvents attributes (e.g. x-tenant); absent when none",
  event: "the CloudEvent in the JSON event format (application/cloudevents+json), the payload as `data`",
};

/** Values that are the same on every message of a channel. */
function constants(
  queue: string,
  naming: CloudEventNaming,
  source: string | undefined,
  subscribed: boolean,
): Record<string, string> {
  // `{topic}` is the queue's name on a message sent to the queue, and each copy's topic on a queue that
  // subscribes to topics: then the type is not one value.
  const varies = subscribed && naming.type.includes(TOPIC_PLACEHOLDER);
  const type = renderTarget(naming.type.replaceAll(TOPIC_PLACEHOLDER, queue), queue);
  return {
    "ce-specversion": "1.0",
    ...(varies ? {} : { "ce-type": type, type }),
    "ce-datacontenttype": "application/json",
    "content-type": "application/json",
    ...(source === undefined ? {} : { "ce-source": source }),
  };
}

function describeHeaders(
  names: { always: string[]; sometimes: string[] },
  fixed: Record<string, string>,
  extra: { name: string; required: boolean }[] = [],
): HeaderDescription[] {
  const all = [
    ...names.always.map((name) => ({ name, required: true })),
    ...names.sometimes.map((name) => ({ name, required: false })),
    ...extra,
  ];
  return all.map(({ name, required }) => ({
    name,
    required,
    description: describeHeader(name),
    ...(fixed[name] === undefined ? {} : { const: fixed[name] }),
  }));
}

/**
 * The structured-mode payload: the CloudEvent in the JSON event format around the queue's data, its
 * members read off the relays' own structured encoding (keyless: the members every event has).
 */
function structuredPayload(
  queue: string,
  naming: CloudEventNaming,
  fixed: Record<string, string>,
  what: string,
): (data: JsonSchema) => JsonSchema {
  const event = JSON.parse(
    structuredEvent(cloudEventAttributes(sampleMessage(queue, true), naming), "{}"),
  ) as Record<string, unknown>;
  const keyless = JSON.parse(
    structuredEvent(cloudEventAttributes(sampleMessage(queue, false), naming), "{}"),
  ) as Record<string, unknown>;
  return (data) => ({
    type: "object",
    description: `${what}, JSON event format; \`data\` is the queue's payload`,
    properties: Object.fromEntries(
      Object.keys(event).map((name) => [
        name,
        name === "data"
          ? data
          : {
              type: "string",
              description: ATTRIBUTE_MEANING[name] ?? name,
              ...(fixed[`ce-${name}`] === undefined ? {} : { const: fixed[`ce-${name}`] }),
            },
      ]),
    ),
    required: Object.keys(keyless),
    additionalProperties: {
      type: "string",
      description: "an extension attribute: each message header whose name is a CloudEvents extension name",
    },
  });
}

/** protocol and host:port of a URL, nothing else: no user info, no query string can reach the document. */
function serverOf(url: string): { protocol: string; host: string; pathname: string } {
  const parsed = new URL(redactConnectionString(url));
  return { protocol: parsed.protocol.slice(0, -1), host: parsed.host, pathname: parsed.pathname };
}

/**
 * The transport of one queue relayed by `relay`. The relay modules are imported only for the kinds used:
 * each loads its broker client.
 */
export async function describeTransport(
  queue: string,
  relay: RelayConfig,
  context: SourceContext,
  subscribed = false,
): Promise<TransportDescription> {
  const naming = eventNaming(relay, {
    source:
      context.databaseUrl === undefined ? undefined : defaultEventSource(context.databaseUrl, context.schema),
  });
  // Unknown until run time when the service uses an embedded Postgres: its database decides.
  const source =
    relay.eventSource !== undefined || context.databaseUrl !== undefined ? naming.source : undefined;
  const fixed = constants(queue, naming, source, subscribed);
  const extensions =
    "ce-<name> for each message header whose name is a CloudEvents extension name (lower-case letters and digits, e.g. ce-tenant)";
  switch (relay.type) {
    case "http": {
      const { httpRelayHeaders } = await import("../relay/http.js");
      const names = headerNames(queue, (m) => httpRelayHeaders(m, naming, relay.headers).keys());
      const signed = relay.signingSecret !== undefined;
      const url = new URL(relay.url);
      const server = serverOf(relay.url);
      return {
        kind: "http",
        servers: [{ protocol: server.protocol, host: server.host }],
        address: url.pathname,
        contentType: "application/json",
        mode: "binary",
        headers: describeHeaders(
          {
            // Static config headers: their names only, never their values (an authorization token).
            always: names.always.filter(
              (n) => !relay.headers || !Object.keys(relay.headers).some((h) => h.toLowerCase() === n),
            ),
            sometimes: names.sometimes,
          },
          fixed,
          [
            ...(signed
              ? ["webhook-id", "webhook-timestamp", "webhook-signature"].map((name) => ({
                  name,
                  required: true,
                }))
              : []),
          ],
        ).concat(
          Object.keys(relay.headers ?? {}).map((name) => ({
            name: name.toLowerCase(),
            required: true,
            description: "a static header of the relay config (its value is not shown)",
          })),
        ),
        otherHeaders: `${extensions}; each other message header (e.g. x-tenant) as a plain header, as it is where HTTP carries it (printable ASCII, no %), else percent-encoded like ce-* values`,
        bindings: {
          operation: { method: relay.method, bindingVersion: "0.3.0" },
        },
        description: `${relay.method} to ${server.protocol}://${server.host}${url.pathname}${url.search === "" ? "" : "?…"}, CloudEvents HTTP binding, binary content mode: the body is the payload's JSON text, ce-* header values percent-encoded (decodeURIComponent them). ${signed ? "Signed per Standard Webhooks (webhook-* headers). " : ""}Answer 2xx to ack; 408, 429, 5xx and 3xx are retried, other 4xx dead-letter.`,
      };
    }
    case "nats": {
      const { natsEventMessage, streamSubjectFor } = await import("../relay/nats.js");
      const structured = relay.contentMode === "structured";
      const names = headerNames(queue, (m) => natsEventMessage(m, naming, relay.contentMode).headers.keys());
      const servers = (Array.isArray(relay.servers) ? relay.servers : [relay.servers]).map((s) =>
        // NATS accepts a bare host:port.
        serverOf(s.includes("://") ? s : `nats://${s}`),
      );
      return {
        kind: "nats",
        servers: servers.map((s) => ({ protocol: "nats", host: s.host })),
        address: renderTarget(relay.subject, queue),
        contentType: structured ? "application/cloudevents+json" : "application/json",
        mode: relay.contentMode,
        // Set through the publish option msgID, not the header function.
        headers: describeHeaders(names, fixed, [{ name: "Nats-Msg-Id", required: true }]),
        otherHeaders: structured
          ? "each message header that is not an attribute (e.g. x-tenant) as it is"
          : `${extensions}; each other message header (e.g. x-tenant) as it is`,
        ...(structured
          ? { wrapPayload: structuredPayload(queue, naming, fixed, "the message data: the CloudEvent") }
          : {}),
        bindings: { operation: { bindingVersion: "0.1.0" } },
        description: `JetStream publish to subject ${renderTarget(relay.subject, queue)}${relay.stream === undefined ? " (a stream must capture it)" : ` (stream ${relay.stream}, subjects ${streamSubjectFor(relay.subject)}, created when missing)`}, CloudEvents NATS binding, ${structured ? "structured content mode: the body is the JSON event format, the payload as `data`" : "binary content mode: the body is the payload's JSON text, ce-* header values percent-encoded (decodeURIComponent them)"}.`,
      };
    }
    case "rabbitmq": {
      const { rabbitmqEventHeaders } = await import("../relay/rabbitmq.js");
      const names = headerNames(queue, (m) =>
        Object.keys(rabbitmqEventHeaders(m, cloudEventAttributes(m, naming), relay.headerPrefix)),
      );
      const server = serverOf(relay.url);
      const routingKey = renderTarget(relay.routingKey, queue);
      const vhost = server.pathname.length > 1 ? decodeURIComponent(server.pathname.slice(1)) : "/";
      return {
        kind: "rabbitmq",
        servers: [{ protocol: server.protocol, host: server.host }],
        address: routingKey,
        contentType: "application/json",
        mode: "binary",
        headers: describeHeaders(names, fixed),
        otherHeaders: `${extensions}, values as they are (no percent-encoding); each other message header (e.g. x-tenant) as it is`,
        bindings: {
          channel: {
            is: "routingKey",
            exchange: {
              name: relay.exchange,
              ...(relay.exchangeType === undefined ? {} : { type: relay.exchangeType }),
              durable: true,
              autoDelete: false,
              vhost,
            },
            bindingVersion: "0.3.0",
          },
          // Persistent, mandatory (an unroutable message is retried, not dropped), on a confirm channel.
          operation: { deliveryMode: 2, mandatory: true, bindingVersion: "0.3.0" },
          message: { messageType: fixed.type, bindingVersion: "0.3.0" },
        },
        description: `Published to exchange "${relay.exchange}" (${relay.exchange === "" ? "the default exchange" : (relay.exchangeType ?? "existing")}) with routing key ${routingKey}${relay.declareQueue === undefined ? "" : `, into durable queue ${relay.declareQueue}`}; Knative's RabbitMQ protocol binding for CloudEvents, binary content mode: the body is the payload's JSON text, attributes are ${relay.headerPrefix}* entries of the headers table. AMQP properties: messageId = the outbox id, contentType = application/json, type = the event type, timestamp = creation time (seconds), persistent.`,
      };
    }
    case "redis": {
      const { redisEventFields } = await import("../relay/redis.js");
      const names = headerNames(queue, (m) => redisEventFields(m, naming).filter((_, i) => i % 2 === 0));
      const server = serverOf(relay.url);
      const stream = renderTarget(relay.stream, queue);
      return {
        kind: "redis",
        servers: [{ protocol: server.protocol, host: server.host }],
        address: stream,
        contentType: "application/cloudevents+json",
        mode: "structured",
        // The entry's fields but `event`, which is the payload.
        headers: describeHeaders(
          { always: names.always.filter((n) => n !== "event"), sometimes: names.sometimes },
          fixed,
        ),
        otherHeaders: "no other fields",
        wrapPayload: structuredPayload(queue, naming, fixed, "field `event`: the CloudEvent"),
        bindings: {},
        description: `XADD to stream ${stream} (MAXLEN ~ ${relay.maxLen}), CloudEvents structured content mode (Redis has no binding): field \`event\` holds the event, fields id, type, subject and headers copy what routing and dedupe need.`,
      };
    }
  }
}
