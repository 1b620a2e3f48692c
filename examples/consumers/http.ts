// A webhook receiver for the http relay, on the consumer inbox: verifies the Standard Webhooks signature
// (±5 minutes), decodes the CloudEvent (HTTP binding, binary mode, percent-decoded), and runs the handler in
// one transaction with the inbox record: a webhook delivered twice (a lost answer) takes effect once.
//   OUTBOX_SIGNING_SECRET=whsec_... DATABASE_URL=postgres://... npx tsx examples/consumers/http.ts   (:8080)
import http from "node:http";
import { pathToFileURL } from "node:url";
import type pg from "pg";
// In your project: import { createWebhookHandler, type Inbox } from "pg-outbox-worker/inbox".
import { createWebhookHandler, type Inbox } from "../../src/inbox/index.js";
import { type ReceivedEvent, receivedEvent } from "./event.js";
import { billingInbox, billOrder, poolFromEnv } from "./inbox.js";
import type { OrderPlaced } from "./types/order.placed.js";

/**
 * A server answering 200 once `onEvent` committed (or for a duplicate), 401 to a bad or stale signature, 400
 * to a malformed event (both dead-lettered by the relay), 500 when `onEvent` threw (retried by the relay).
 */
export function createWebhookServer(
  inbox: Inbox<pg.PoolClient>,
  secret: string | string[],
  onEvent: (event: ReceivedEvent<OrderPlaced>, client: pg.PoolClient) => Promise<void> | void,
): http.Server {
  const handler = createWebhookHandler(inbox, {
    signingSecret: secret,
    handler: (event, client) => onEvent(receivedEvent<OrderPlaced>(event), client),
    onError: (error, event) => console.error(`event ${event.id} failed; the relay will retry`, error),
  });
  // With express: app.post("/outbox", handler), mounted before any body parser (it reads the raw body).
  return http.createServer(handler);
}

if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(process.argv[1]).href) {
  const secret = process.env.OUTBOX_SIGNING_SECRET;
  if (secret === undefined) throw new Error("set OUTBOX_SIGNING_SECRET to the relay's whsec_... secret");
  const inbox = await billingInbox(poolFromEnv());
  createWebhookServer(inbox, secret, async (event, client) => {
    await billOrder(event, client);
    console.log(`billed order ${event.payload.orderId} for ${event.payload.customer}`);
  }).listen(Number(process.env.PORT ?? 8080));
}
