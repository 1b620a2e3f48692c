import { Redis } from "ioredis";
import type { z } from "zod";
import type { MessageContext } from "../contract/handler.js";
import { errorMessage, TransientError } from "../contract/handler-errors.js";
import { redactConnectionString } from "../util/redact.js";
import {
  type CloudEventNaming,
  cloudEventAttributes,
  eventNaming,
  isEventAttribute,
  structuredEvent,
} from "./cloudevents.js";
import { parseRelayConfig, QUEUE_PLACEHOLDER, redisRelayConfigSchema, renderTarget } from "./config.js";
import { withDeadline } from "./deadline.js";
import { RelayHealthTracker } from "./health.js";
import type { Relay, RelayDeps } from "./relay.js";
import { throttledLog } from "./throttle.js";

const MAX_RECONNECT_DELAY_MS = 2000;

/**
 * XADDs each message to a Redis stream (`MAXLEN ~ maxLen`) as a CloudEvent. Redis has no CloudEvents
 * binding, so the event is in structured content mode: field `event` holds the JSON event format
 * (`application/cloudevents+json`, the data spliced in as the payload's stored JSON text, unchanged).
 * Fields `id`, `type` and `subject` (left out for a keyless message) copy those attributes so consumers
 * dedupe and route without parsing; `headers` (JSON, left out when empty) holds the message headers whose
 * names cannot be extension attributes (say `x-tenant`). Streams cannot dedupe by our id: a redelivered
 * message is added again, so consumers dedupe by the `id` field. Every failure
 * is transient: an unreachable server, a timeout, or an error reply such as WRONGTYPE (a configuration
 * mistake, logged, must not dead-letter messages).
 */
export async function createRedisRelay(
  input: z.input<typeof redisRelayConfigSchema>,
  deps: RelayDeps,
): Promise<Relay> {
  const config = parseRelayConfig(redisRelayConfigSchema, input);
  const url = redactConnectionString(config.url);
  const logger = deps.logger.child({ relay: "redis", url });
  const naming = eventNaming(config, deps);
  const logOnce = throttledLog(30_000);
  const client = new Redis(config.url, {
    lazyConnect: true,
    connectTimeout: config.timeoutMs,
    // Fail at once while disconnected instead of queueing: the worker's retry is the queue, and a command
    // queued here could still run after its handler was told it failed.
    enableOfflineQueue: false,
    maxRetriesPerRequest: 0,
    autoResendUnfulfilledCommands: false,
    // A blackholed socket otherwise looks alive until TCP keepalive gives up, minutes later.
    socketTimeout: config.timeoutMs,
    retryStrategy: (times) => Math.min(times * 100, MAX_RECONNECT_DELAY_MS),
  });
  // With `{queue}` in the stream name, the probe can only check the stream of the queue it serves.
  const probeStream =
    deps.queue !== undefined || !config.stream.includes(QUEUE_PLACEHOLDER)
      ? renderTarget(config.stream, deps.queue ?? "")
      : undefined;
  const health = new RelayHealthTracker(`redis ${url} stream ${config.stream}`);
  client.on("error", (error: unknown) => {
    health.unreachable(error);
    logOnce("connection", () => logger.warn({ error: errorMessage(error) }, "redis connection error"));
  });
  client.on("ready", () => {
    health.reachable();
    logger.info("redis relay connected");
  });

  try {
    await withDeadline(client.connect(), { timeoutMs: config.timeoutMs, what: `redis ${url}: connect` });
  } catch (error) {
    // The client keeps reconnecting in the background; until then messages fail as transient.
    logger.warn({ error: errorMessage(error) }, "redis unreachable at startup; messages will be retried");
  }

  const handler = async (_payload: unknown, message: MessageContext): Promise<void> => {
    const stream = renderTarget(config.stream, message.queue);
    const fields = redisEventFields(message, naming);
    const what = `redis ${url} XADD ${stream}`;
    try {
      await withDeadline(client.xadd(stream, "MAXLEN", "~", config.maxLen, "*", ...fields), {
        signal: message.signal,
        timeoutMs: config.timeoutMs,
        what,
      });
      health.ok();
    } catch (error) {
      if (error instanceof TransientError) throw error;
      if (isReplyError(error)) {
        // WRONGTYPE and the like: the key exists as something else; no retry fixes that by itself.
        health.misconfigured(`redis refused XADD to ${stream}: ${errorMessage(error)}`);
        logOnce(`reply:${stream}`, () =>
          logger.error(
            { stream, error: errorMessage(error) },
            "redis refused XADD; retrying, check the config",
          ),
        );
      }
      throw new TransientError(`${what} failed`, { cause: error });
    }
  };

  let closing: Promise<void> | undefined;
  const close = () => {
    closing ??= (async () => {
      await withDeadline(client.quit(), { timeoutMs: config.timeoutMs, what: "quit" }).catch(() => {});
      client.disconnect();
    })();
    return closing;
  };
  async function probe(): Promise<void> {
    if (client.status !== "ready") {
      health.unreachable(new TransientError(`redis ${url}: not connected (${client.status})`));
      return;
    }
    health.reachable();
    if (probeStream === undefined) return;
    const type = await withDeadline(client.type(probeStream), {
      timeoutMs: config.timeoutMs,
      what: `redis ${url} TYPE ${probeStream}`,
    });
    if (type === "stream" || type === "none") health.ok();
    else health.misconfigured(`redis key ${probeStream} is a ${type}, not a stream: XADD is refused`);
  }

  const relayHealth = async () => {
    await probe().catch((error: unknown) => health.unreachable(error));
    return health.snapshot();
  };
  return { kind: "redis", handler, health: relayHealth, close };
}

/** The stream entry's fields, as [name, value, name, value, ...] for XADD. */
export function redisEventFields(message: MessageContext, naming: CloudEventNaming): string[] {
  const attributes = cloudEventAttributes(message, naming);
  const fields = ["id", attributes.id, "type", attributes.type];
  if (attributes.subject !== undefined) fields.push("subject", attributes.subject);
  const others = Object.entries(message.headers).filter(([name]) => !isEventAttribute(name));
  if (others.length > 0) fields.push("headers", JSON.stringify(Object.fromEntries(others)));
  // The stored JSON text, byte for byte: a re-serialised payload would round numbers beyond 2^53.
  fields.push("event", structuredEvent(attributes, message.rawPayload));
  return fields;
}

function isReplyError(error: unknown): boolean {
  return error instanceof Error && error.name === "ReplyError";
}
