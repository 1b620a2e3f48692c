// A durable JetStream consumer for the nats relay: the CloudEvent in binary mode (ce-* headers,
// percent-encoded), typed payload, explicit ack.
//   npx tsx examples/consumers/nats.ts        (NATS_URL, STREAM default OUTBOX)
import { pathToFileURL } from "node:url";
import { AckPolicy, connect, type JsMsg, type NatsConnection } from "nats";
import { type ReceivedEvent, receivedEvent } from "./event.js";
import type { OrderPlaced } from "./types/order.placed.js";

/** One JetStream message as the event. */
export function decodeMessage(m: JsMsg): ReceivedEvent<OrderPlaced> {
  const attributes: Record<string, string | undefined> = {};
  const headers: Record<string, string> = {};
  for (const name of m.headers?.keys() ?? []) {
    const value = m.headers?.get(name) ?? "";
    // Binary mode: each attribute is a ce-<name> header, its value percent-encoded.
    if (/^ce-/i.test(name)) attributes[name.slice(3).toLowerCase()] = decodeURIComponent(value);
    else if (!/^nats-/i.test(name) && name !== "traceparent" && name !== "tracestate") headers[name] = value;
  }
  // m.json() is JSON.parse: parse m.string() yourself for integers beyond 2^53.
  return receivedEvent<OrderPlaced>(attributes, m.json(), headers);
}

/** The durable consumer `name` on `stream` (created, explicit acks, when missing). */
export async function durableConsumer(nc: NatsConnection, stream: string, name: string) {
  await (await nc.jetstreamManager()).consumers.add(stream, {
    durable_name: name,
    ack_policy: AckPolicy.Explicit,
  });
  return nc.jetstream().consumers.get(stream, name);
}

if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(process.argv[1]).href) {
  const nc = await connect({ servers: process.env.NATS_URL ?? "nats://127.0.0.1:4222" });
  const consumer = await durableConsumer(nc, process.env.STREAM ?? "OUTBOX", "billing");
  const seen = new Set<string>(); // keep ids in a durable store in production
  for await (const m of await consumer.consume()) {
    const event = decodeMessage(m);
    if (!seen.has(event.id)) {
      seen.add(event.id);
      console.log(`order ${event.payload.orderId} for ${event.payload.customer}`);
    }
    m.ack();
  }
}
