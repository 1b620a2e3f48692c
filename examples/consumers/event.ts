// In your project: import { … } from "pg-outbox-worker/inbox".
import type { InboxEvent } from "../../src/inbox/index.js";

/** What every consumer example hands its handler: the CloudEvent's attributes and the typed payload. */
export interface ReceivedEvent<T> {
  /** The outbox message id: the same on every redelivery (the inbox dedupes by it, with `source`). */
  id: string;
  type: string;
  source: string;
  /** The message's ordering key (the event's subject), or null when it has none. */
  key: string | null;
  time: string;
  /** Other CloudEvents extension attributes (message headers such as `tenant`, the trace context). */
  extensions: Record<string, string>;
  /** Message headers that cannot be attributes (such as `x-tenant`), as the transport carries them. */
  headers: Record<string, string>;
  payload: T;
}

/**
 * The inbox's decoded event, with the payload typed by the generated type: the outbox validated it against
 * the queue's schema at publish. Check it yourself (a JSON Schema validator on the schemas/ file) when the
 * producer is not yours. `event.data` holds the JSON text as sent, for integers beyond 2^53.
 */
export function receivedEvent<T>(event: InboxEvent): ReceivedEvent<T> {
  return {
    id: event.id,
    type: event.type,
    source: event.source,
    key: event.subject ?? null,
    time: event.time ?? "",
    extensions: event.extensions,
    headers: event.headers,
    payload: event.payload as T,
  };
}
