// An amqplib consumer for the rabbitmq relay, on the consumer inbox: the CloudEvent in binary mode
// (Knative's RabbitMQ binding: ce-* entries of the headers table), handled in one transaction with its
// inbox record, then acked. A crash or a closed channel before the ack requeues it; the inbox finds it handled.
//   DATABASE_URL=postgres://... npx tsx examples/consumers/rabbitmq.ts   (AMQP_URL, QUEUE default orders)
import { pathToFileURL } from "node:url";
import amqp, { type Channel, type Message } from "amqplib";
import type pg from "pg";
// In your project: import { handleAmqpMessage, MalformedEventError, type Inbox } from "pg-outbox-worker/inbox".
import { handleAmqpMessage, type Inbox, MalformedEventError } from "../../src/inbox/index.js";
import { type ReceivedEvent, receivedEvent } from "./event.js";
import { billingInbox, billOrder, poolFromEnv } from "./inbox.js";
import type { OrderPlaced } from "./types/order.placed.js";

/** One delivery through the inbox, then its ack; requeued on the handler's error, dropped when it is no event. */
export async function handleDelivery(
  inbox: Inbox<pg.PoolClient>,
  channel: Channel,
  msg: Message,
  onEvent: (event: ReceivedEvent<OrderPlaced>, client: pg.PoolClient) => Promise<void> | void,
): Promise<void> {
  try {
    await handleAmqpMessage(inbox, msg, (event, client) =>
      onEvent(receivedEvent<OrderPlaced>(event), client),
    );
  } catch (error) {
    channel.nack(msg, false, !(error instanceof MalformedEventError));
    throw error;
  }
  channel.ack(msg);
}

if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(process.argv[1]).href) {
  const conn = await amqp.connect(process.env.AMQP_URL ?? "amqp://guest:guest@127.0.0.1:5672");
  const inbox = await billingInbox(poolFromEnv());
  const channel = await conn.createChannel();
  await channel.prefetch(50);
  await channel.consume(process.env.QUEUE ?? "orders", (msg) => {
    if (msg === null) return; // the queue was deleted
    handleDelivery(inbox, channel, msg, billOrder).catch((error) => console.error(error));
  });
}
