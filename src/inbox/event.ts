import { OutboxError } from "../contract/errors.js";

/**
 * One received CloudEvent, as every transport's decoder hands it to the handler. Attribute values are
 * decoded (percent-decoding undone where the binding applies it).
 */
export interface InboxEvent {
  specversion: "1.0";
  /** The outbox message id: the same on every redelivery. With `source`, the inbox's dedupe key. */
  id: string;
  /** Names the producer (`/outbox/<database>/<schema>` by default): ids are unique per source. */
  source: string;
  type: string;
  /** The message's key, when it has one. */
  subject?: string;
  /** RFC 3339. */
  time?: string;
  datacontenttype?: string;
  /** Every other attribute: the trace context (`traceparent`, `tracestate`) and extensions such as `tenant`. */
  extensions: Record<string, string>;
  /** The transport's headers that are not event attributes (a message header such as `x-tenant`). */
  headers: Record<string, string>;
  /**
   * The event data as text: the payload's stored JSON, byte for byte, in binary mode and in events of our
   * relays in structured mode (JSON.parse it with a big-number-aware parser for integers beyond 2^53).
   */
  data: string;
  /** `data` parsed with JSON.parse (numbers beyond 2^53 rounded); undefined when the content type is not JSON. */
  payload: unknown;
}

/** An event that cannot be read: a required attribute missing, bad encoding, data that is not JSON. */
export class MalformedEventError extends OutboxError {
  override name = "MalformedEventError";
  constructor(
    /** The attribute, header or field at fault. */
    readonly field: string,
    readonly reason: string,
  ) {
    super(`malformed CloudEvent: ${field}: ${reason}`);
  }
}

const CORE = ["specversion", "id", "source", "type", "subject", "time", "datacontenttype"] as const;

/** The event from its attributes (already decoded), its data text and the transport's other headers. */
export function eventFromAttributes(
  attributes: Record<string, string | undefined>,
  data: string,
  headers: Record<string, string>,
): InboxEvent {
  if (attributes.specversion !== "1.0") {
    throw new MalformedEventError("specversion", 'must be "1.0"');
  }
  for (const name of ["id", "source", "type"] as const) {
    if (attributes[name] === undefined || attributes[name] === "") {
      throw new MalformedEventError(name, "required attribute missing");
    }
  }
  const extensions: Record<string, string> = {};
  for (const [name, value] of Object.entries(attributes)) {
    if (!(CORE as readonly string[]).includes(name) && value !== undefined) extensions[name] = value;
  }
  const contentType = attributes.datacontenttype;
  let payload: unknown;
  if (contentType === undefined || /^application\/(?:[\w.+-]+\+)?json\b/i.test(contentType)) {
    try {
      payload = JSON.parse(data);
    } catch {
      throw new MalformedEventError("data", "is not JSON");
    }
  }
  const event: InboxEvent = {
    specversion: "1.0",
    id: attributes.id as string,
    source: attributes.source as string,
    type: attributes.type as string,
    extensions,
    headers,
    data,
    payload,
  };
  if (attributes.subject !== undefined) event.subject = attributes.subject;
  if (attributes.time !== undefined) event.time = attributes.time;
  if (contentType !== undefined) event.datacontenttype = contentType;
  return event;
}

/**
 * An event in structured content mode (the JSON event format, `application/cloudevents+json`). The data's
 * text is cut out of the document as sent when the document is laid out as our relays write it (attributes,
 * then `data` last), so numbers beyond 2^53 arrive intact; otherwise it is re-serialised from the parse.
 */
export function decodeStructured(text: string, headers: Record<string, string>): InboxEvent {
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch {
    throw new MalformedEventError("event", "is not JSON");
  }
  if (typeof parsed !== "object" || parsed === null || Array.isArray(parsed)) {
    throw new MalformedEventError("event", "is not a JSON object (a batch is not supported)");
  }
  const { data, data_base64: base64, ...rest } = parsed as Record<string, unknown>;
  if (base64 !== undefined) throw new MalformedEventError("data_base64", "binary data is not supported");
  const attributes: Record<string, string> = {};
  for (const [name, value] of Object.entries(rest)) {
    if (typeof value !== "string") throw new MalformedEventError(name, "attribute value must be a string");
    attributes[name] = value;
  }
  let raw = data === undefined ? "null" : JSON.stringify(data);
  if (data !== undefined) {
    const head = JSON.stringify(rest).slice(0, -1);
    const prefix = head === "{" ? '{"data":' : `${head},"data":`;
    if (text.startsWith(prefix) && text.endsWith("}")) raw = text.slice(prefix.length, -1);
  }
  // Structured mode has no separate content type for data: JSON unless the event says otherwise.
  return eventFromAttributes(attributes, raw, headers);
}
