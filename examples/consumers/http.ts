// A webhook receiver for the http relay: verifies the Standard Webhooks signature, reads the CloudEvent
// (HTTP binding, binary mode) with the cloudevents SDK, and hands on the typed payload.
//   OUTBOX_SIGNING_SECRET=whsec_... npx tsx examples/consumers/http.ts        (listens on :8080)
import http from "node:http";
import { pathToFileURL } from "node:url";
import { HTTP } from "cloudevents";
import { Webhook } from "standardwebhooks";
import { type ReceivedEvent, receivedEvent } from "./event.js";
import type { OrderPlaced } from "./types/order.placed.js";

/** One request: throws when the signature (or its ±5 minute timestamp) does not verify. */
export function decodeWebhook(
  webhook: Webhook,
  headers: http.IncomingHttpHeaders,
  body: string,
): ReceivedEvent<OrderPlaced> {
  const flat: Record<string, string> = {};
  for (const [name, value] of Object.entries(headers)) if (typeof value === "string") flat[name] = value;
  webhook.verify(body, flat);
  const parsed = HTTP.toEvent({ headers: flat, body });
  const event = Array.isArray(parsed) ? parsed[0] : parsed;
  if (event === undefined) throw new Error("empty batch");
  // The SDK leaves the binding's percent-encoding of ce-* values in place: undo it.
  const attributes: Record<string, string | undefined> = {};
  for (const [name, value] of Object.entries(event as object)) {
    if (name !== "data" && typeof value === "string") attributes[name] = decodeURIComponent(value);
  }
  // The message's other headers (x-tenant…) arrive as plain headers among HTTP's own, percent-encoded too.
  const plain: Record<string, string> = {};
  for (const [name, value] of Object.entries(flat)) {
    if (!/^(ce-|webhook-)/.test(name)) plain[name] = safeDecode(value);
  }
  // event.data is JSON.parse(body): parse `body` yourself for integers beyond 2^53.
  return receivedEvent<OrderPlaced>(attributes, event.data, plain);
}

function safeDecode(value: string): string {
  try {
    return decodeURIComponent(value);
  } catch {
    return value; // not percent-encoded by the relay: a header of HTTP's own
  }
}

/** A server that answers 204 to each verified event after `onEvent`, 401 to a bad signature, 500 on error. */
export function createWebhookServer(
  secret: string,
  onEvent: (event: ReceivedEvent<OrderPlaced>) => Promise<void> | void,
): http.Server {
  const webhook = new Webhook(secret);
  return http.createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (chunk: Buffer) => chunks.push(chunk));
    req.on("end", async () => {
      let event: ReceivedEvent<OrderPlaced>;
      try {
        event = decodeWebhook(webhook, req.headers, Buffer.concat(chunks).toString("utf8"));
      } catch {
        // 4xx: the relay dead-letters the message instead of retrying it.
        res.writeHead(401).end();
        return;
      }
      try {
        await onEvent(event);
        res.writeHead(204).end();
      } catch {
        res.writeHead(500).end(); // retried by the relay
      }
    });
  });
}

if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(process.argv[1]).href) {
  const secret = process.env.OUTBOX_SIGNING_SECRET;
  if (secret === undefined) throw new Error("set OUTBOX_SIGNING_SECRET to the relay's whsec_... secret");
  const seen = new Set<string>(); // keep ids in a durable store in production
  createWebhookServer(secret, (event) => {
    if (seen.has(event.id)) return;
    seen.add(event.id);
    const order = event.payload;
    console.log(`order ${order.orderId} for ${order.customer}: ${(order.totalCents / 100).toFixed(2)}`);
  }).listen(Number(process.env.PORT ?? 8080));
}
