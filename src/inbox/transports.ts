import { decodeHeaderValue } from "../wire/header-encoding.js";
import { decodeStructured, eventFromAttributes, type InboxEvent, MalformedEventError } from "./event.js";
import type { Inbox, InboxResult } from "./inbox.js";
import type { InboxClient } from "./options.js";

// The broker messages are typed by shape, so this module loads no broker client: ioredis's XREADGROUP
// entry fields, a nats.js JsMsg, an amqplib Message each fit.

/** A Redis stream entry's fields: ioredis's flat `[name, value, …]` list, or a record. */
export type RedisEntryFields = readonly string[] | Record<string, string>;

/** The part of a NATS (JetStream) message the inbox reads: a nats.js `JsMsg` or `Msg` is one. */
export interface NatsMessageLike {
  /** The body. */
  data: Uint8Array;
  /** The headers, when it has any. */
  headers?: NatsHeadersLike | undefined;
}

/** The part of nats.js `MsgHdrs` the inbox reads. */
export interface NatsHeadersLike {
  /** Every header name. */
  keys(): string[];
  /** The (first) value of a header. */
  get(name: string): string;
}

/** The part of an AMQP 0-9-1 message the inbox reads: an amqplib `Message` (consume or get) is one. */
export interface AmqpMessageLike {
  content: Buffer;
  properties: { contentType?: unknown; headers?: Record<string, unknown> | undefined };
}

/** Your effects for one event, in the inbox's transaction on `client`. */
export type InboxHandler<C extends InboxClient, T> = (event: InboxEvent, client: C) => Promise<T> | T;

/**
 * The event of one entry the redis relay XADDed: structured mode in field `event`; field `headers` (JSON)
 * holds the message headers that are not attributes.
 */
export function decodeRedisEntry(fields: RedisEntryFields): InboxEvent {
  const record: Record<string, string> = {};
  if (Array.isArray(fields)) {
    for (let i = 0; i + 1 < fields.length; i += 2) record[fields[i] as string] = fields[i + 1] as string;
  } else Object.assign(record, fields);
  if (record.event === undefined)
    throw new MalformedEventError("event", "field missing: not an entry of the redis relay");
  let headers: Record<string, string> = {};
  if (record.headers !== undefined) {
    try {
      headers = JSON.parse(record.headers) as Record<string, string>;
    } catch {
      throw new MalformedEventError("headers", "field is not JSON");
    }
  }
  return decodeStructured(record.event, headers);
}

/**
 * The event of one NATS message, per the CloudEvents NATS binding: binary mode (`ce-*` headers,
 * percent-decoded, `ce-datacontenttype` included), or structured mode when `Content-Type` says
 * `application/cloudevents+json`. JetStream's own `Nats-*` headers are left out of `headers`.
 */
export function decodeNatsMessage(message: NatsMessageLike): InboxEvent {
  const attributes: Record<string, string> = {};
  const headers: Record<string, string> = {};
  let contentType: string | undefined;
  for (const name of message.headers?.keys() ?? []) {
    const value = message.headers?.get(name) ?? "";
    const lower = name.toLowerCase();
    if (lower.startsWith("ce-")) {
      try {
        attributes[lower.slice(3)] = decodeHeaderValue(value);
      } catch (error) {
        throw new MalformedEventError(name, (error as Error).message);
      }
    } else if (lower === "content-type") contentType = value;
    else if (!lower.startsWith("nats-") && lower !== "traceparent" && lower !== "tracestate")
      headers[name] = value;
  }
  const body = utf8(message.data, "data");
  if (contentType !== undefined && /^application\/cloudevents\+json\b/i.test(contentType))
    return decodeStructured(body, headers);
  return eventFromAttributes(attributes, body, headers);
}

/** An attribute's entry in an AMQP headers table: `ce-` (the RabbitMQ binding) or the AMQP binding's forms. */
const AMQP_ATTRIBUTE = /^(?:ce-|cloudEvents[_:])(.+)$/i;

/**
 * The event of one AMQP 0-9-1 message, per the RabbitMQ binding our relay follows by default (`ce-*`
 * entries of the headers table) or the CloudEvents AMQP binding's `cloudEvents_*` / `cloudEvents:*` (the
 * relay's `headerPrefix`): values as they are (table strings are UTF-8, not percent-encoded),
 * `datacontenttype` the `contentType` property, the body the data.
 */
export function decodeAmqpMessage(message: AmqpMessageLike): InboxEvent {
  const attributes: Record<string, string> = {};
  const headers: Record<string, string> = {};
  for (const [name, value] of Object.entries(message.properties.headers ?? {})) {
    const text = Buffer.isBuffer(value) ? utf8(value, name) : String(value);
    const attribute = AMQP_ATTRIBUTE.exec(name)?.[1];
    if (attribute !== undefined) attributes[attribute.toLowerCase()] = text;
    else if (name !== "traceparent" && name !== "tracestate") headers[name] = text;
  }
  const contentType = message.properties.contentType;
  if (typeof contentType === "string") {
    if (/^application\/cloudevents\+json\b/i.test(contentType))
      return decodeStructured(utf8(message.content, "content"), headers);
    attributes.datacontenttype = contentType;
  }
  return eventFromAttributes(attributes, utf8(message.content, "content"), headers);
}

/**
 * Decodes a Redis stream entry of the redis relay and runs `handler` through the inbox. XACK the entry
 * after this resolves (duplicate or not): the commit comes first, so a crash before the XACK leaves the
 * entry pending, it is read again (or a relay retry adds it again), and the inbox finds it handled.
 * Throws {@link MalformedEventError} for an entry that is no event (ack it, or move it aside: it never
 * decodes), and the handler's error after rolling back (do not ack: let it be read again).
 */
export function handleRedisEntry<C extends InboxClient, T>(
  inbox: Inbox<C>,
  fields: RedisEntryFields,
  handler: InboxHandler<C, T>,
): Promise<InboxResult<T>> {
  return Promise.resolve()
    .then(() => decodeRedisEntry(fields))
    .then((event) => inbox.handle(event, handler));
}

/**
 * Decodes a NATS JetStream message and runs `handler` through the inbox. `ack()` the message after this
 * resolves: the commit comes first, so a crash before the ack means redelivery after the consumer's ack
 * wait, and the inbox finds it handled. On the handler's error, `nak()` (redelivered) rather than ack;
 * on {@link MalformedEventError}, `term()` it.
 */
export function handleNatsMessage<C extends InboxClient, T>(
  inbox: Inbox<C>,
  message: NatsMessageLike,
  handler: InboxHandler<C, T>,
): Promise<InboxResult<T>> {
  return Promise.resolve()
    .then(() => decodeNatsMessage(message))
    .then((event) => inbox.handle(event, handler));
}

/**
 * Decodes an AMQP message (amqplib) and runs `handler` through the inbox. `channel.ack(message)` after
 * this resolves: the commit comes first, so a crash or a closed channel before the ack requeues the
 * message and the inbox finds it handled. On the handler's error, `nack` with requeue; on
 * {@link MalformedEventError}, `nack` without requeue (or to a dead-letter exchange).
 */
export function handleAmqpMessage<C extends InboxClient, T>(
  inbox: Inbox<C>,
  message: AmqpMessageLike,
  handler: InboxHandler<C, T>,
): Promise<InboxResult<T>> {
  return Promise.resolve()
    .then(() => decodeAmqpMessage(message))
    .then((event) => inbox.handle(event, handler));
}

function utf8(bytes: Uint8Array, field: string): string {
  try {
    return new TextDecoder("utf-8", { fatal: true }).decode(bytes);
  } catch {
    throw new MalformedEventError(field, "is not UTF-8 text");
  }
}
