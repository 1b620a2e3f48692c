import { stringify } from "yaml";
import type { QueueDefinition } from "../contract/queue.js";
import { type TopicDefinition, topicMatches } from "../contract/topic.js";
import type { RelayConfig } from "../relay/config.js";
import { registerSecrets, registerUrlSecrets, scrubDeep } from "../util/redact.js";
import { type JsonSchema, payloadJsonSchema, topicJsonSchema } from "./json-schema.js";
import { type DeclaredSubscriptions, mergeSubscriptions } from "./queues-of-module.js";
import { describeTransport, type SourceContext, type TransportDescription } from "./transports.js";

type AnyQueue = QueueDefinition<unknown, unknown>;
type AnyTopic = TopicDefinition<unknown, unknown>;
export type AsyncApiDocument = Record<string, unknown>;

export interface AsyncApiOptions {
  title?: string;
  version?: string;
  /** The service config's relays (queue → relay): they decide addresses, servers, headers and bindings. */
  relays?: Record<string, RelayConfig>;
  /** The database and schema the service runs on: the default CloudEvents `source` is made from them. */
  source?: SourceContext;
  /** The module's topics: one channel each, with a `send` and one `receive` per subscribed queue. */
  topics?: readonly AnyTopic[];
  /**
   * Queue → topic names or patterns, as declared (module, service config); a relay's own `subscribe` is
   * added from `relays`. The database's subscriptions table is not read: see buildAsyncApi.
   */
  subscriptions?: DeclaredSubscriptions;
}

/** AsyncAPI 3.0 ids (channel, message, server, operation keys) are letters, digits, `.`, `-`, `_`. */
function idFor(name: string, taken: Set<string>): string {
  const base = name.replace(/[^\w.-]/g, "_");
  let id = base;
  for (let n = 2; taken.has(id); n++) id = `${base}_${n}`;
  taken.add(id);
  return id;
}

/**
 * A payload schema whose shared parts zod wrote once, under its own `definitions` (`$defs` in 2020-12), and
 * refers to as `#/definitions/Name`: a recursive schema, or one given an id. Inside the AsyncAPI document a
 * `#/…` ref resolves from the document's root, where those definitions are not. Each becomes a component
 * schema of its own (`<payload id>.<name>`: its id, or the property holding it), and every ref to it is
 * rewritten to point there.
 */
function hoistDefinitions(
  schema: JsonSchema,
  id: string,
  taken: Set<string>,
  components: Record<string, unknown>,
): JsonSchema {
  const { definitions, $defs, ...rest } = schema;
  const defs = { ...(definitions as JsonSchema | undefined), ...($defs as JsonSchema | undefined) };
  if (Object.keys(defs).length === 0) return schema;
  // Old ref → new ref; a JSON Pointer escapes `~` and `/` in a name.
  const moved = new Map<string, string>();
  const targets: [string, unknown][] = [];
  // The payload first, then the definitions (one may be reached only through another).
  const named = propertyNames([rest, ...Object.values(defs)]);
  for (const [name, def] of Object.entries(defs)) {
    // zod names a schema without an id `__schema0`, `__schema1`…: the property that holds it says more.
    const target = idFor(`${id}.${/^__schema\d+$/.test(name) ? (named.get(name) ?? "item") : name}`, taken);
    const pointer = name.replaceAll("~", "~0").replaceAll("/", "~1");
    moved.set(`#/definitions/${pointer}`, `#/components/schemas/${target}`);
    moved.set(`#/$defs/${pointer}`, `#/components/schemas/${target}`);
    targets.push([target, def]);
  }
  const rewrite = (node: unknown): unknown => {
    if (Array.isArray(node)) return node.map(rewrite);
    if (node === null || typeof node !== "object") return node;
    return Object.fromEntries(
      Object.entries(node).map(([k, v]) => [
        k,
        k === "$ref" && typeof v === "string" ? (moved.get(v) ?? v) : rewrite(v),
      ]),
    );
  };
  for (const [target, def] of targets) components[target] = rewrite(def);
  return rewrite(rest) as JsonSchema;
}

/**
 * For each `$defs`/`definitions` entry a ref names: the property holding the first such ref (depth first,
 * in document order), e.g. `root` for `{ properties: { root: { $ref: "#/$defs/__schema0" } } }`.
 */
function propertyNames(schemas: unknown[]): Map<string, string> {
  const names = new Map<string, string>();
  const walk = (node: unknown, property: string | undefined): void => {
    if (Array.isArray(node)) {
      for (const item of node) walk(item, property);
      return;
    }
    if (node === null || typeof node !== "object") return;
    for (const [key, value] of Object.entries(node)) {
      if (key === "$ref" && typeof value === "string" && property !== undefined) {
        const name = /^#\/(?:\$defs|definitions)\/(.+)$/.exec(value)?.[1];
        if (name !== undefined && !names.has(name)) names.set(name, property);
      } else if (key === "properties" && value !== null && typeof value === "object") {
        for (const [prop, sub] of Object.entries(value)) walk(sub, prop);
      } else walk(value, property);
    }
  };
  walk(schemas, undefined);
  return names;
}

function headersSchema(transport: TransportDescription): JsonSchema {
  return {
    type: "object",
    properties: Object.fromEntries(
      transport.headers.map((h) => [
        h.name,
        { type: "string", description: h.description, ...(h.const === undefined ? {} : { const: h.const }) },
      ]),
    ),
    required: transport.headers.filter((h) => h.required).map((h) => h.name),
    additionalProperties: { type: "string", description: transport.otherHeaders },
  };
}

/** Every credential a relay config holds, so that no text derived from it can show one. */
function registerRelaySecrets(relays: Record<string, RelayConfig>): void {
  for (const relay of Object.values(relays)) {
    if (relay.type === "nats") {
      for (const server of Array.isArray(relay.servers) ? relay.servers : [relay.servers])
        registerUrlSecrets(server);
    } else {
      registerUrlSecrets(relay.url);
    }
    if (relay.type === "http") {
      registerSecrets(...Object.values(relay.headers ?? {}));
      registerSecrets(...[relay.signingSecret ?? []].flat());
    }
  }
}

/** The relays' own `subscribe` (for their queue), as declared subscriptions. */
function relaySubscriptions(relays: Record<string, RelayConfig>): DeclaredSubscriptions {
  const declared: DeclaredSubscriptions = new Map();
  for (const [queue, relay] of Object.entries(relays)) {
    if (relay.subscribe !== undefined) declared.set(queue, [...relay.subscribe]);
  }
  return declared;
}

/** Per topic, the queues that get a copy of its events and through which declared patterns. */
function subscribersOfTopics(
  topics: readonly AnyTopic[],
  subscriptions: DeclaredSubscriptions,
): { byTopic: Map<string, { queue: string; patterns: string[] }[]>; unmatched: string[] } {
  const byTopic = new Map(topics.map((t) => [t.topic, [] as { queue: string; patterns: string[] }[]]));
  const unmatched: string[] = [];
  // Queue-name order, as fan_out writes the copies; one receive per queue however many patterns match.
  for (const queue of [...subscriptions.keys()].sort()) {
    for (const pattern of subscriptions.get(queue) ?? []) {
      const matched = topics.filter((t) => topicMatches(pattern, t.topic));
      if (matched.length === 0) unmatched.push(`"${pattern}" (queue ${queue})`);
      for (const topic of matched) {
        const subscribers = byTopic.get(topic.topic) ?? [];
        const known = subscribers.find((s) => s.queue === queue);
        if (known === undefined) subscribers.push({ queue, patterns: [pattern] });
        else known.patterns.push(pattern);
      }
    }
  }
  return { byTopic, unmatched };
}

/**
 * The AsyncAPI 3.0.0 document of the queues: one channel per queue, its message's payload the queue's JSON
 * Schema (output side, draft-07 as AsyncAPI's Schema Object). With relays, a relayed queue's channel has
 * the relay's address, servers, the headers it sends and its bindings; a queue the relays name but the
 * module does not define gets a schema-less payload (any JSON). One `send` operation per channel: the
 * outbox sends, consumers receive. No credential reaches the document: servers are protocol and host only,
 * and every string is scrubbed of the relays' secrets.
 *
 * Topics: one channel each (address the topic name, payload the topic's schema), one `send` (the producer
 * publishes) and one `receive` per subscribed queue (each queue gets its own copy). The subscribers are the
 * declared ones (`subscriptions`, the relays' `subscribe`), never the database's table: the document is
 * built offline from code and config, the same for the same inputs, as a contract checked in beside them.
 * A pattern shows on every topic here it matches; one matching none is noted in `info.description`.
 */
export async function buildAsyncApi(
  queues: readonly AnyQueue[],
  options: AsyncApiOptions = {},
): Promise<AsyncApiDocument> {
  const relays = options.relays ?? {};
  registerRelaySecrets(relays);
  const topics = options.topics ?? [];
  const declared = mergeSubscriptions(options.subscriptions, relaySubscriptions(relays));
  const { byTopic, unmatched } = subscribersOfTopics(topics, declared);
  const all: AnyQueue[] = [...queues];
  for (const name of Object.keys(relays)) {
    if (!all.some((q) => q.name === name)) all.push({ name, schema: undefined });
  }
  const source = options.source ?? { schema: "outbox" };

  const ids = new Set<string>();
  const serverIds = new Map<string, string>();
  const servers: Record<string, unknown> = {};
  const channels: Record<string, unknown> = {};
  const operations: Record<string, unknown> = {};
  const schemas: Record<string, unknown> = {};
  const messages: Record<string, unknown> = {};

  for (const queue of all) {
    const id = idFor(queue.name, ids);
    const relay = relays[queue.name];
    const defined = queues.some((q) => q.name === queue.name);
    // The payload's own entry first, then what it refers to.
    schemas[id] = {};
    const payload = hoistDefinitions(payloadJsonSchema(queue, "draft-07"), id, ids, schemas);
    schemas[id] = {
      title: queue.name,
      ...(defined ? {} : { description: "not defined in the queues module: any JSON value" }),
      ...payload,
    };
    const payloadRef = { $ref: `#/components/schemas/${id}` };
    const transport =
      relay === undefined
        ? undefined
        : await describeTransport(queue.name, relay, source, (declared.get(queue.name) ?? []).length > 0);

    const channelServers: { $ref: string }[] = [];
    for (const server of transport?.servers ?? []) {
      const key = `${transport?.kind} ${server.protocol}://${server.host}`;
      let serverId = serverIds.get(key);
      if (serverId === undefined) {
        serverId = idFor(`${transport?.kind}-${server.host}`, ids);
        serverIds.set(key, serverId);
        servers[serverId] = { host: server.host, protocol: server.protocol };
      }
      channelServers.push({ $ref: `#/servers/${serverId}` });
    }

    messages[id] = {
      name: queue.name,
      title: `${queue.name} event`,
      contentType: transport?.contentType ?? "application/json",
      ...(transport === undefined ? {} : { description: `CloudEvents 1.0, ${transport.mode} content mode` }),
      payload: transport?.wrapPayload === undefined ? payloadRef : transport.wrapPayload(payloadRef),
      ...(transport === undefined ? {} : { headers: headersSchema(transport) }),
      ...(transport?.bindings.message === undefined
        ? {}
        : { bindings: { amqp: transport.bindings.message } }),
    };
    const bindingKey =
      transport === undefined
        ? undefined
        : { http: "http", nats: "nats", rabbitmq: "amqp", redis: "redis" }[transport.kind];
    channels[id] = {
      address: transport?.address ?? queue.name,
      title: queue.name,
      description:
        transport?.description ??
        (relay === undefined && options.relays !== undefined
          ? `Outbox queue "${queue.name}": not relayed by the config (handled in-process).`
          : `Outbox queue "${queue.name}".`),
      ...(channelServers.length === 0 ? {} : { servers: channelServers }),
      messages: { [id]: { $ref: `#/components/messages/${id}` } },
      ...(transport?.bindings.channel === undefined || bindingKey === undefined
        ? {}
        : { bindings: { [bindingKey]: transport.bindings.channel } }),
    };
    operations[`send_${id}`] = {
      action: "send",
      title: `Send ${queue.name}`,
      channel: { $ref: `#/channels/${id}` },
      messages: [{ $ref: `#/channels/${id}/messages/${id}` }],
      ...(transport?.bindings.operation === undefined || bindingKey === undefined
        ? {}
        : { bindings: { [bindingKey]: transport.bindings.operation } }),
    };
  }

  for (const topic of topics) {
    // Its own id: a topic and a queue may share a name (the topic order.placed, the queue order.placed).
    const id = idFor(`topic.${topic.topic}`, ids);
    schemas[id] = {};
    const payload = hoistDefinitions(topicJsonSchema(topic, "draft-07"), id, ids, schemas);
    schemas[id] = { title: topic.topic, ...payload };
    messages[id] = {
      name: topic.topic,
      title: `${topic.topic} event`,
      contentType: "application/json",
      payload: { $ref: `#/components/schemas/${id}` },
    };
    const subscribers = byTopic.get(topic.topic) ?? [];
    channels[id] = {
      address: topic.topic,
      title: `${topic.topic} (topic)`,
      description: `Outbox topic "${topic.topic}": publishing an event writes one copy per subscribed queue in the producer's transaction (header outbox-topic: "${topic.topic}"); each subscriber retries, orders and dead-letters its copy on its own. ${
        subscribers.length === 0
          ? "No subscription to it is declared here (the database may hold others: outbox-worker subscriptions); an event no queue subscribes to is kept as a dead letter no_subscribers."
          : `Declared subscribers: ${subscribers.map((s) => `${s.queue} (${s.patterns.join(", ")})`).join("; ")}.`
      }`,
      messages: { [id]: { $ref: `#/components/messages/${id}` } },
    };
    const ref = {
      channel: { $ref: `#/channels/${id}` },
      messages: [{ $ref: `#/channels/${id}/messages/${id}` }],
    };
    operations[`send_${id}`] = { action: "send", title: `Publish ${topic.topic}`, ...ref };
    for (const { queue, patterns } of subscribers) {
      operations[idFor(`receive_${id}_${queue}`, ids)] = {
        action: "receive",
        title: `${queue} receives ${topic.topic}`,
        description: `Queue "${queue}" gets its own copy of each event (subscribed to ${patterns.map((p) => `"${p}"`).join(", ")}): its own lease, retries, dead letters and per-key order; a failing subscriber never re-runs or delays another.`,
        ...ref,
        "x-outbox-queue": queue,
        "x-outbox-subscriptions": patterns,
      };
    }
  }

  const document: AsyncApiDocument = {
    asyncapi: "3.0.0",
    info: {
      title: options.title ?? "Outbox events",
      version: options.version ?? "1.0.0",
      description: `Messages published through pg-outbox-worker's transactional outbox, as the built-in relays send them (CloudEvents 1.0). Delivery is at least once: consumers dedupe by the event id.${
        unmatched.length === 0
          ? ""
          : ` Subscriptions that match no topic defined here (their events are not described): ${unmatched.join(", ")}.`
      }`,
    },
    ...(Object.keys(servers).length === 0 ? {} : { servers }),
    defaultContentType: "application/json",
    channels,
    operations,
    components: { schemas, messages },
  };
  return scrubDeep(document) as AsyncApiDocument;
}

/** The document as YAML (the default) or JSON text, ending with a newline. */
export function renderAsyncApi(document: AsyncApiDocument, format: "yaml" | "json" = "yaml"): string {
  return format === "json" ? `${JSON.stringify(document, null, 2)}\n` : stringify(document, { lineWidth: 0 });
}
