import amqp, { type ChannelModel, type ConfirmChannel } from "amqplib";
import type { z } from "zod";
import type { MessageContext } from "../contract/handler.js";
import { errorMessage, PermanentError, TransientError } from "../contract/handler-errors.js";
import { redactConnectionString } from "../util/redact.js";
import { binaryAttributes, cloudEventAttributes, eventNaming, isEventAttribute } from "./cloudevents.js";
import {
  parseRelayConfig,
  QUEUE_PLACEHOLDER,
  type RabbitmqRelayConfig,
  rabbitmqRelayConfigSchema,
  renderTarget,
} from "./config.js";
import { withDeadline } from "./deadline.js";
import { type RelayHealth, RelayHealthTracker } from "./health.js";
import { LazyConnection } from "./lazy-connection.js";
import type { Relay, RelayDeps } from "./relay.js";
import { throttledLog } from "./throttle.js";

const RETRY_CONNECT_AFTER_MS = 1000;
/** Seconds; two missed beats close a connection that a dead network would otherwise keep "open" for minutes. */
const DEFAULT_HEARTBEAT_S = 10;

interface RabbitSession {
  model: ChannelModel;
  channel: ConfirmChannel;
  /** Ids the broker returned as unroutable, counted until their confirm arrives. */
  returned: Map<string, number>;
}

/**
 * Publishes each message as a CloudEvent in binary content mode, persistent and mandatory on a confirm
 * channel, and resolves only once the broker confirmed it. CloudEvents' own AMQP binding is for AMQP 1.0
 * (`cloudEvents:` application properties), which a 0-9-1 client never sees as such; RabbitMQ users follow
 * Knative eventing-rabbitmq's "RabbitMQ Protocol Binding for CloudEvents" instead (its RabbitMQ source and
 * broker read it, and so did the binding proposed for the .NET SDK): each attribute as a `ce-<name>` entry of
 * the headers table, its value as is (table strings are UTF-8), `datacontenttype` as the `contentType`
 * property, the data (the payload's stored JSON text, unchanged) as the body. The outbox id is also
 * `messageId`, the type the AMQP `type`. RabbitMQ cannot dedupe: a redelivered message is published
 * again, so consumers dedupe by `ce-id` (= `messageId`). Message headers whose names cannot be extension
 * attributes (say `x-tenant`) stay in the headers table as they are. `headerPrefix` switches the attribute
 * names to the AMQP binding's `cloudEvents_<name>` (or `cloudEvents:<name>`) for consumers that read those.
 *
 * Every failure is transient: the broker down (the connection is re-opened on the next publish), a nack,
 * a timeout, or an unroutable message (returned by the broker: a configuration mistake that must not
 * silently drop messages, nor dead-letter them). Only a message that cannot be encoded is permanent.
 */
export async function createRabbitmqRelay(
  input: z.input<typeof rabbitmqRelayConfigSchema>,
  deps: RelayDeps,
): Promise<Relay> {
  const config = parseRelayConfig(rabbitmqRelayConfigSchema, input);
  const url = redactConnectionString(config.url);
  const what = `rabbitmq ${url}`;
  const logger = deps.logger.child({ relay: "rabbitmq", url });
  const naming = eventNaming(config, deps);
  const logOnce = throttledLog(30_000);
  const health = new RelayHealthTracker(
    `${what} exchange "${config.exchange}" routing key "${config.routingKey}"`,
    {
      report: { logger, relay: "rabbitmq" },
    },
  );

  const connection: LazyConnection<RabbitSession> = new LazyConnection({
    what,
    timeoutMs: config.timeoutMs,
    retryDelayMs: RETRY_CONNECT_AFTER_MS,
    dispose: (session) => session.model.close(),
    open: async () => {
      const model = await amqp.connect(withDefaultHeartbeat(config.url), { timeout: config.timeoutMs });
      let session: RabbitSession | undefined;
      const drop = () => {
        if (session !== undefined) connection.invalidate(session);
      };
      model.on("error", (error: Error) => {
        logOnce("connection", () => logger.warn({ error: errorMessage(error) }, "rabbitmq connection error"));
      });
      model.on("close", drop);
      model.on("blocked", (reason: string) => logger.warn({ reason }, "rabbitmq blocked publishing"));
      model.on("unblocked", () => logger.info("rabbitmq unblocked publishing"));
      try {
        const channel = await model.createConfirmChannel();
        session = { model, channel, returned: new Map() };
        const returned = session.returned;
        channel.on("error", (error: Error) => {
          // A missing exchange closes the channel; the declare that hit it reports it.
          if (isNotFound(error)) return;
          logOnce("channel", () => logger.error({ error: errorMessage(error) }, "rabbitmq channel error"));
        });
        channel.on("close", drop);
        channel.on("return", (msg: { properties: { messageId?: unknown } }) => {
          const id = String(msg.properties.messageId);
          returned.set(id, (returned.get(id) ?? 0) + 1);
        });
        await declare(channel);
      } catch (error) {
        await model.close().catch(() => {});
        if (isNotFound(error)) {
          health.misconfigured(
            `exchange "${config.exchange}" does not exist: create it, or set the relay's exchangeType to have it declared`,
          );
          throw new TransientError(`${what}: exchange "${config.exchange}" does not exist`, { cause: error });
        }
        throw error;
      }
      // The exchange is there (and the queue, when declared): whatever was wrong at the last connect is fixed.
      health.ok();
      logger.info("rabbitmq relay connected");
      return session;
    },
  });

  async function declare(channel: ConfirmChannel): Promise<void> {
    if (config.exchange !== "" && config.exchangeType !== undefined) {
      await channel.assertExchange(config.exchange, config.exchangeType, { durable: true });
    } else if (config.exchange !== "") {
      // A missing exchange fails here, once per connect, rather than closing the channel on every publish.
      await channel.checkExchange(config.exchange);
    }
    if (config.declareQueue === undefined) return;
    await channel.assertQueue(config.declareQueue, { durable: true });
    if (config.exchange !== "") {
      // The queue name is unknown here; "#" is the topic-exchange pattern for any of them.
      await channel.bindQueue(
        config.declareQueue,
        config.exchange,
        config.routingKey.replaceAll(QUEUE_PLACEHOLDER, "#"),
      );
    }
  }

  await connection.get().catch((error: unknown) => {
    health.unreachable(error);
    logger.warn({ error: errorMessage(error) }, "rabbitmq unreachable at startup; messages will be retried");
  });

  const handler = async (_payload: unknown, message: MessageContext): Promise<void> => {
    const routingKey = renderTarget(config.routingKey, message.queue);
    const target = `${what} exchange "${config.exchange}" routing key "${routingKey}"`;
    const session = await connection.get().catch((error: unknown) => {
      health.unreachable(error);
      throw error;
    });
    // The stored JSON text, byte for byte: a re-serialised payload would round numbers beyond 2^53.
    const content = Buffer.from(message.rawPayload);
    const attributes = cloudEventAttributes(message, naming);
    const headers = rabbitmqEventHeaders(message, attributes, config.headerPrefix);
    const confirmed = new Promise<void>((resolve, reject) => {
      const options = {
        persistent: true,
        mandatory: true,
        messageId: message.id,
        contentType: attributes.datacontenttype,
        type: attributes.type,
        timestamp: Math.floor(message.createdAt.getTime() / 1000),
        headers,
      };
      try {
        session.channel.publish(config.exchange, routingKey, content, options, (error: unknown) => {
          if (error) {
            const failure = new TransientError(`${target}: not confirmed`, { cause: error });
            health.unreachable(failure);
            return reject(failure);
          }
          // The broker sends basic.return before the ack of the same message.
          if (takeReturned(session, message.id)) {
            health.misconfigured(
              `no queue is bound to exchange "${config.exchange}" for routing key "${routingKey}": messages are returned as unroutable`,
            );
            return reject(new TransientError(`${target}: unroutable, no queue is bound`));
          }
          health.ok();
          resolve();
        });
      } catch (error) {
        // amqplib throws RangeError for a headers table it cannot encode: no retry will fix that.
        if (error instanceof RangeError)
          reject(new PermanentError(`${target}: ${error.message}`, { cause: error }));
        else reject(new TransientError(`${target}: publish failed`, { cause: error }));
      }
    });
    await withDeadline(confirmed, { signal: message.signal, timeoutMs: config.timeoutMs, what: target });
  };

  async function relayHealth(): Promise<RelayHealth> {
    // Opens the connection when it is down, which checks (or declares) the exchange again.
    await connection.get().then(
      () => health.reachable(),
      (error: unknown) => health.unreachable(error),
    );
    return health.snapshot();
  }

  return { kind: "rabbitmq", handler, health: relayHealth, close: () => connection.close() };
}

/**
 * The headers table: message headers that are not attributes as they are, then `<prefix><name>` (`ce-` by
 * default) for every attribute but `datacontenttype` (the `contentType` property), so a stray message
 * header named like one cannot replace the event's own.
 */
export function rabbitmqEventHeaders(
  message: MessageContext,
  attributes: ReturnType<typeof cloudEventAttributes>,
  prefix: RabbitmqRelayConfig["headerPrefix"] = "ce-",
): Record<string, string> {
  const headers: Record<string, string> = {};
  for (const [name, value] of Object.entries(message.headers)) {
    if (!isEventAttribute(name)) headers[name] = value;
  }
  for (const [name, value] of binaryAttributes(attributes)) headers[`${prefix}${name}`] = value;
  // The plain W3C entries too, as the HTTP relay sends them: AMQP tracing instrumentation reads those.
  if (attributes.traceparent !== undefined) headers.traceparent = attributes.traceparent;
  if (attributes.tracestate !== undefined) headers.tracestate = attributes.tracestate;
  return headers;
}

/** The broker closed the channel with 404 NOT_FOUND: an exchange (or queue) that does not exist. */
function isNotFound(error: unknown): boolean {
  return typeof error === "object" && error !== null && (error as { code?: unknown }).code === 404;
}

function takeReturned(session: RabbitSession, id: string): boolean {
  const count = session.returned.get(id);
  if (count === undefined) return false;
  if (count <= 1) session.returned.delete(id);
  else session.returned.set(id, count - 1);
  return true;
}

function withDefaultHeartbeat(url: string): string {
  const parsed = new URL(url);
  if (!parsed.searchParams.has("heartbeat"))
    parsed.searchParams.set("heartbeat", String(DEFAULT_HEARTBEAT_S));
  return parsed.toString();
}
