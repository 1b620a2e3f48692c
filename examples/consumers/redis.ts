// A Redis Streams consumer group for the redis relay: XREADGROUP, the CloudEvent in structured mode
// (field `event`), typed payload, XACK.
//   npx tsx examples/consumers/redis.ts        (REDIS_URL, STREAM default outbox:order.placed)
import { pathToFileURL } from "node:url";
import { Redis } from "ioredis";
import { type ReceivedEvent, receivedEvent } from "./event.js";
import type { OrderPlaced } from "./types/order.placed.js";

/** One stream entry's fields ([name, value, name, value, …]) as the event. */
export function decodeEntry(list: string[]): ReceivedEvent<OrderPlaced> {
  const fields: Record<string, string> = {};
  for (let i = 0; i + 1 < list.length; i += 2) fields[list[i] as string] = list[i + 1] as string;
  if (fields.event === undefined) throw new Error("no event field: not an entry of the redis relay");
  // Structured mode: application/cloudevents+json, every attribute and `data` in one object. JSON.parse
  // rounds integers beyond 2^53: use a big-number-aware parser if your payloads hold such numbers.
  const { data, ...rest } = JSON.parse(fields.event) as Record<string, unknown>;
  const attributes: Record<string, string | undefined> = {};
  for (const [name, value] of Object.entries(rest)) if (typeof value === "string") attributes[name] = value;
  const headers = fields.headers === undefined ? {} : (JSON.parse(fields.headers) as Record<string, string>);
  return receivedEvent<OrderPlaced>(attributes, data, headers);
}

/** Creates the consumer group (from the stream's start) unless it exists. */
export async function ensureGroup(redis: Redis, stream: string, group: string): Promise<void> {
  await redis.xgroup("CREATE", stream, group, "0", "MKSTREAM").catch((error: unknown) => {
    if (!String(error).includes("BUSYGROUP")) throw error; // BUSYGROUP: it exists already
  });
}

/** Reads one batch for `consumer` (waiting up to blockMs), hands each event on, then XACKs it. */
export async function readBatch(
  redis: Redis,
  options: { stream: string; group: string; consumer: string; blockMs: number },
  onEvent: (event: ReceivedEvent<OrderPlaced>) => Promise<void> | void,
): Promise<number> {
  const batches = (await redis.xreadgroup(
    "GROUP",
    options.group,
    options.consumer,
    "COUNT",
    100,
    "BLOCK",
    options.blockMs,
    "STREAMS",
    options.stream,
    ">",
  )) as [string, [string, string[]][]][] | null;
  let handled = 0;
  for (const [, entries] of batches ?? []) {
    for (const [entryId, list] of entries) {
      await onEvent(decodeEntry(list));
      await redis.xack(options.stream, options.group, entryId);
      handled++;
    }
  }
  return handled;
}

if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(process.argv[1]).href) {
  const redis = new Redis(process.env.REDIS_URL ?? "redis://127.0.0.1:6379");
  const options = {
    stream: process.env.STREAM ?? "outbox:order.placed",
    group: "billing",
    consumer: "worker-1",
    blockMs: 5000,
  };
  await ensureGroup(redis, options.stream, options.group);
  for (;;) {
    await readBatch(redis, options, async (event) => {
      // Dedupe by id (at-least-once delivery): a redelivered message is added to the stream again.
      if (await redis.set(`billing:seen:${event.id}`, "1", "EX", 86_400, "NX")) {
        console.log(`order ${event.payload.orderId} for ${event.payload.customer}`);
      }
    });
  }
}
