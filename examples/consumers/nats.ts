// A durable JetStream consumer for the nats relay, on the consumer inbox: the CloudEvent in binary mode
// (ce-* headers, percent-decoded), handled in one transaction with its inbox record, then acked. A crash
// between the commit and the ack: JetStream redelivers after the ack wait, and the inbox finds it handled.
//   DATABASE_URL=postgres://... npx tsx examples/consumers/nats.ts   (NATS_URL, STREAM default OUTBOX)
import { pathToFileURL } from "node:url";
import { AckPolicy, connect, type JsMsg, type NatsConnection } from "nats";
import type pg from "pg";
// In your project: import { handleNatsMessage, MalformedEventError, type Inbox } from "pg-outbox-worker/inbox".
import { handleNatsMessage, type Inbox, MalformedEventError } from "../../src/inbox/index.js";
import { type ReceivedEvent, receivedEvent } from "./event.js";
import { billingInbox, billOrder, poolFromEnv } from "./inbox.js";
import type { OrderPlaced } from "./types/order.placed.js";

/** The durable consumer `name` on `stream` (created, explicit acks, when missing). */
export async function durableConsumer(nc: NatsConnection, stream: string, name: string) {
  await (await nc.jetstreamManager()).consumers.add(stream, {
    durable_name: name,
    ack_policy: AckPolicy.Explicit,
  });
  return nc.jetstream().consumers.get(stream, name);
}

/** One message through the inbox, then its ack; nak on the handler's error, term when it is no event. */
export async function handleMessage(
  inbox: Inbox<pg.PoolClient>,
  m: JsMsg,
  onEvent: (event: ReceivedEvent<OrderPlaced>, client: pg.PoolClient) => Promise<void> | void,
): Promise<void> {
  try {
    await handleNatsMessage(inbox, m, (event, client) => onEvent(receivedEvent<OrderPlaced>(event), client));
  } catch (error) {
    if (error instanceof MalformedEventError) m.term();
    else m.nak(1000);
    throw error;
  }
  m.ack();
}

if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(process.argv[1]).href) {
  const nc = await connect({ servers: process.env.NATS_URL ?? "nats://127.0.0.1:4222" });
  const inbox = await billingInbox(poolFromEnv());
  const consumer = await durableConsumer(nc, process.env.STREAM ?? "OUTBOX", "billing");
  for await (const m of await consumer.consume()) {
    await handleMessage(inbox, m, billOrder).catch((error) => console.error(error));
  }
}
