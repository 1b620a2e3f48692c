// A Redis Streams consumer group for the redis relay, on the consumer inbox: XREADGROUP, each entry handled
// in one transaction with its inbox record, then XACK. A crash between the commit and the XACK leaves the
// entry pending; read again (or added again by a relay retry), the inbox finds it handled.
//   DATABASE_URL=postgres://... npx tsx examples/consumers/redis.ts   (REDIS_URL, STREAM default outbox:order.placed)
import { pathToFileURL } from "node:url";
import { Redis } from "ioredis";
import type pg from "pg";
// In your project: import { handleRedisEntry, type Inbox } from "pg-outbox-worker/inbox".
import { handleRedisEntry, type Inbox } from "../../src/inbox/index.js";
import { type ReceivedEvent, receivedEvent } from "./event.js";
import { billingInbox, billOrder, poolFromEnv } from "./inbox.js";
import type { OrderPlaced } from "./types/order.placed.js";

/** Creates the consumer group (from the stream's start) unless it exists. */
export async function ensureGroup(redis: Redis, stream: string, group: string): Promise<void> {
  await redis.xgroup("CREATE", stream, group, "0", "MKSTREAM").catch((error: unknown) => {
    if (!String(error).includes("BUSYGROUP")) throw error; // BUSYGROUP: it exists already
  });
}

/**
 * Reads one batch for `consumer` (waiting up to blockMs; `from` "0" re-reads its pending entries after a
 * restart), handles each entry through the inbox, then XACKs it: commit first, ack second.
 */
export async function readBatch(
  redis: Redis,
  inbox: Inbox<pg.PoolClient>,
  options: { stream: string; group: string; consumer: string; blockMs: number; from?: ">" | "0" },
  onEvent: (event: ReceivedEvent<OrderPlaced>, client: pg.PoolClient) => Promise<void> | void,
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
    options.from ?? ">",
  )) as [string, [string, string[]][]][] | null;
  let handled = 0;
  for (const [, entries] of batches ?? []) {
    for (const [entryId, fields] of entries) {
      // Throws on the handler's error: the entry stays pending and is read again with from "0".
      await handleRedisEntry(inbox, fields, (event, client) =>
        onEvent(receivedEvent<OrderPlaced>(event), client),
      );
      await redis.xack(options.stream, options.group, entryId);
      handled++;
    }
  }
  return handled;
}

if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(process.argv[1]).href) {
  const redis = new Redis(process.env.REDIS_URL ?? "redis://127.0.0.1:6379");
  const inbox = await billingInbox(poolFromEnv());
  const options = {
    stream: process.env.STREAM ?? "outbox:order.placed",
    group: "billing",
    consumer: "worker-1",
    blockMs: 5000,
  };
  await ensureGroup(redis, options.stream, options.group);
  // First the entries this consumer read but never acked (a crash), then new ones.
  await readBatch(redis, inbox, { ...options, from: "0" }, billOrder);
  for (;;) await readBatch(redis, inbox, options, billOrder);
}
