/** What every consumer example hands its handler: the CloudEvent's attributes and the typed payload. */
export interface ReceivedEvent<T> {
  /** The outbox message id: the same on every redelivery, so dedupe by it. */
  id: string;
  type: string;
  source: string;
  /** The message's ordering key (the event's subject), or null when it has none. */
  key: string | null;
  time: string;
  /** Other CloudEvents extension attributes (message headers such as `tenant`). */
  extensions: Record<string, string>;
  /** Message headers that cannot be attributes (such as `x-tenant`), as the transport carries them. */
  headers: Record<string, string>;
  payload: T;
}

const CORE = new Set(["specversion", "id", "type", "source", "subject", "time", "datacontenttype", "data"]);

/**
 * Builds the event from attributes read off the transport (already decoded), and the parsed data. The
 * payload type is the generated one: the outbox validated it against the queue's schema at publish. Check
 * it yourself (a JSON Schema validator on the schemas/ file) when the producer is not yours.
 */
export function receivedEvent<T>(
  attributes: Record<string, string | undefined>,
  data: unknown,
  headers: Record<string, string> = {},
): ReceivedEvent<T> {
  const { id, type, source, time, subject } = attributes;
  if (attributes.specversion !== "1.0" || id === undefined || type === undefined || source === undefined) {
    throw new Error("not a CloudEvents 1.0 event: specversion, id, type or source missing");
  }
  const extensions: Record<string, string> = {};
  for (const [name, value] of Object.entries(attributes)) {
    if (!CORE.has(name) && value !== undefined) extensions[name] = value;
  }
  return {
    id,
    type,
    source,
    key: subject ?? null,
    time: time ?? "",
    extensions,
    headers,
    payload: data as T,
  };
}
