// An amqplib consumer for the rabbitmq relay: the CloudEvent in binary mode (Knative's RabbitMQ binding:
// ce-* entries of the headers table, values as they are), typed payload, ack.
//   npx tsx examples/consumers/rabbitmq.ts        (AMQP_URL, QUEUE default orders)
import { pathToFileURL } from "node:url";
import amqp, { type Message } from "amqplib";
import { type ReceivedEvent, receivedEvent } from "./event.js";
import type { OrderPlaced } from "./types/order.placed.js";

/** One delivered (or fetched) message as the event. */
export function decodeDelivery(msg: Message): ReceivedEvent<OrderPlaced> {
  const attributes: Record<string, string | undefined> = { datacontenttype: msg.properties.contentType };
  const headers: Record<string, string> = {};
  for (const [name, value] of Object.entries(msg.properties.headers ?? {})) {
    if (name.startsWith("ce-")) attributes[name.slice(3)] = String(value);
    else if (name !== "traceparent" && name !== "tracestate") headers[name] = String(value);
  }
  // The body is the payload's JSON text: JSON.parse rounds integers beyond 2^53.
  return receivedEvent<OrderPlaced>(attributes, JSON.parse(msg.content.toString("utf8")), headers);
}

if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(process.argv[1]).href) {
  const conn = await amqp.connect(process.env.AMQP_URL ?? "amqp://guest:guest@127.0.0.1:5672");
  const channel = await conn.createChannel();
  await channel.prefetch(50);
  const seen = new Set<string>(); // keep ids in a durable store in production
  await channel.consume(process.env.QUEUE ?? "orders", (msg) => {
    if (msg === null) return; // the queue was deleted
    const event = decodeDelivery(msg);
    if (!seen.has(event.id)) {
      seen.add(event.id);
      console.log(`order ${event.payload.orderId} for ${event.payload.customer}`);
    }
    channel.ack(msg);
  });
}
