import type { MessageContext } from "../../src/contract/handler.js";

/**
 * A MessageContext for calling a handler (a relay's) directly, outside a worker: a first delivery with no
 * key or headers unless given. Its `publish` throws: a relay never publishes follow-ups, and a test that
 * reaches it should say so rather than drop them.
 */
export function fakeMessage(
  fields: Pick<MessageContext, "id" | "queue"> & Partial<MessageContext>,
): MessageContext {
  return {
    topic: null,
    key: null,
    headers: {},
    deliveries: 1,
    attempts: 0,
    createdAt: new Date(),
    rawPayload: "{}",
    signal: new AbortController().signal,
    publish: () => {
      throw new Error("fakeMessage: publish is not expected here");
    },
    ...fields,
  };
}

/** Headers fetch (undici) adds to every request by itself: not the relay's, so not in its documentation. */
export const FETCH_OWN_HEADERS: ReadonlySet<string> = new Set([
  "host",
  "connection",
  "content-length",
  "user-agent",
  "accept",
  "accept-encoding",
  "accept-language",
  "sec-fetch-mode",
]);
