import {
  connect,
  ErrorCode,
  type JetStreamClient,
  type JetStreamManager,
  type MsgHdrs,
  type NatsConnection,
  NatsError,
  headers as natsHeaders,
} from "nats";
import type { z } from "zod";
import { OutboxConfigError } from "../contract/errors.js";
import type { MessageContext } from "../contract/handler.js";
import { errorMessage, PermanentError, TransientError } from "../contract/handler-errors.js";
import { DEFAULT_MAX_PAYLOAD_BYTES } from "../contract/payload.js";
import { redactConnectionString } from "../util/redact.js";
import {
  binaryAttributes,
  type CloudEventAttributes,
  type CloudEventNaming,
  cloudEventAttributes,
  encodeHeaderValue,
  eventNaming,
  isEventAttribute,
  structuredEvent,
} from "./cloudevents.js";
import {
  type NatsRelayConfig,
  natsRelayConfigSchema,
  parseRelayConfig,
  QUEUE_PLACEHOLDER,
  renderTarget,
} from "./config.js";
import { withDeadline } from "./deadline.js";
import { type RelayHealth, RelayHealthTracker } from "./health.js";
import { LazyConnection } from "./lazy-connection.js";
import type { Relay, RelayDeps } from "./relay.js";

const RETRY_CONNECT_AFTER_MS = 1000;
/** Room for the event's attributes and headers beside a payload, for the max_payload warning at connect. */
const EVENT_OVERHEAD_BYTES = 4096;
/** JetStream API error: "message size exceeds maximum allowed". */
const JS_MESSAGE_TOO_LARGE = 10054;
/** JetStream API error: "stream name already in use with a different configuration". */
const JS_STREAM_NAME_IN_USE = 10058;
/** JetStream API error: "subjects overlap with an existing stream". */
const JS_SUBJECTS_OVERLAP = 10065;

interface NatsSession {
  nc: NatsConnection;
  js: JetStreamClient;
  /** Made on first use: it costs a round trip (an account info request). */
  jsm?: JetStreamManager;
  connected: boolean;
}

/**
 * Publishes each message to JetStream as a CloudEvent in the NATS protocol binding's binary content mode:
 * the data (the payload's stored JSON text, unchanged) is the message body, and every attribute, including
 * `datacontenttype`, is a `ce-<name>` header, its value percent-encoded (see {@link natsEventHeaders}).
 * The outbox id is also `Nats-Msg-Id`, so the server drops a redelivered id within the stream's duplicate
 * window (2 minutes by default): exactly once per window. Message headers whose names cannot be extension
 * attributes (say `x-tenant`) travel as plain NATS headers (JetStream's own `Nats-*` ones are dropped).
 *
 * A subject no stream captures answers "no responders": a configuration mistake, so it is transient and
 * logged rather than dead-lettering every message, and `health()` reports the relay `misconfigured` (it
 * looks for a capturing stream at connect and on every probe). With `stream` set, the stream is created on
 * connect with the subject (`{queue}` as `>` when it is the last token, else `*`) unless a stream already
 * captures it; an existing stream is never changed.
 * The connection is opened on first use and reconnects by itself; while it is down, messages fail as
 * transient at once instead of waiting in the client's buffer.
 */
export async function createNatsRelay(
  input: z.input<typeof natsRelayConfigSchema>,
  deps: RelayDeps,
): Promise<Relay> {
  const config = parseRelayConfig(natsRelayConfigSchema, input);
  const servers = Array.isArray(config.servers) ? config.servers : [config.servers];
  const shown = servers.map(redactConnectionString);
  const what = `nats ${shown.join(",")}`;
  const logger = deps.logger.child({ relay: "nats", servers: shown });
  const naming = eventNaming(config, deps);
  const streamSubject = config.stream === undefined ? undefined : streamSubjectFor(config.subject);
  // With `{queue}` in the subject, the probe can only check the subject of the queue it serves.
  const probeSubject =
    deps.queue !== undefined || !config.subject.includes(QUEUE_PLACEHOLDER)
      ? renderTarget(config.subject, deps.queue ?? "")
      : undefined;
  const health = new RelayHealthTracker(`${what} subject ${config.subject}`, {
    report: { logger, relay: "nats" },
  });

  /**
   * Creates the configured stream when no stream captures the subject yet, then checks that one does: a
   * subject no stream captures is refused on every publish ("no responders"), however often it is retried.
   */
  async function checkTarget(session: NatsSession): Promise<void> {
    let jsm: JetStreamManager;
    try {
      session.jsm ??= await session.nc.jetstreamManager({ timeout: config.timeoutMs });
      jsm = session.jsm;
    } catch (error) {
      if (error instanceof NatsError && error.code === ErrorCode.JetStreamNotEnabled) {
        return health.misconfigured(`JetStream is not enabled on ${what} (start nats-server with -js)`);
      }
      throw error;
    }
    if (config.stream !== undefined && streamSubject !== undefined) {
      const problem = await ensureStream(jsm, config.stream, streamSubject);
      if (problem !== undefined) return health.misconfigured(problem);
    }
    if (probeSubject === undefined) return health.reachable();
    const captured = await streamsCapturing(jsm, probeSubject);
    if (captured.length > 0) return health.ok();
    health.misconfigured(
      config.stream === undefined
        ? `no JetStream stream captures subject ${probeSubject}: create one, or set the relay's "stream" to have it created`
        : `no JetStream stream captures subject ${probeSubject}`,
    );
  }

  const connection: LazyConnection<NatsSession> = new LazyConnection({
    what,
    timeoutMs: config.timeoutMs,
    retryDelayMs: RETRY_CONNECT_AFTER_MS,
    dispose: (session) => session.nc.close(),
    open: async () => {
      const nc = await connect({
        servers,
        name: "pg-outbox-worker relay",
        timeout: config.timeoutMs,
        maxReconnectAttempts: -1,
        waitOnFirstConnect: false,
      });
      const session: NatsSession = { nc, js: nc.jetstream({ timeout: config.timeoutMs }), connected: true };
      void watchStatus(session, logger, health);
      void nc.closed().then((error) => {
        if (error) logger.warn({ error: errorMessage(error) }, "nats connection closed");
        connection.invalidate(session);
      });
      health.reachable();
      try {
        await checkTarget(session);
      } catch (error) {
        await nc.close().catch(() => {});
        throw new TransientError(`${what}: cannot check the JetStream stream`, { cause: error });
      }
      logger.info({ server: nc.getServer(), maxPayload: nc.info?.max_payload }, "nats relay connected");
      // A payload the publisher accepts (256 KiB by default) but the server refuses is dead-lettered at
      // relay time: warn at connect, while nothing has failed yet.
      const max = nc.info?.max_payload;
      if (max !== undefined && max < DEFAULT_MAX_PAYLOAD_BYTES + EVENT_OVERHEAD_BYTES) {
        logger.warn(
          { maxPayload: max, publisherDefault: DEFAULT_MAX_PAYLOAD_BYTES },
          "the NATS server's max_payload is below what the publisher accepts by default: larger messages will be dead-lettered; lower the publisher's maxPayloadBytes",
        );
      }
      return session;
    },
  });

  await connection.get().catch((error: unknown) => {
    health.unreachable(error);
    logger.warn({ error: errorMessage(error) }, "nats unreachable at startup; messages will be retried");
  });

  const handler = async (_payload: unknown, message: MessageContext): Promise<void> => {
    const subject = renderTarget(config.subject, message.queue);
    const session = await connection.get().catch((error: unknown) => {
      health.unreachable(error);
      throw error;
    });
    if (!session.connected) throw new TransientError(`${what}: disconnected, reconnecting`);
    let event: { data: Uint8Array; headers: MsgHdrs };
    try {
      event = natsEventMessage(message, naming, config.contentMode);
    } catch (error) {
      throw new PermanentError(`message headers cannot be NATS headers: ${errorMessage(error)}`, {
        cause: error,
      });
    }
    const { data, headers } = event;
    // The server refuses a message over its max_payload (1 MiB by default) on every attempt: say so, with
    // the sizes, instead of a round trip and the client's bare error.
    const max = session.nc.info?.max_payload;
    if (max !== undefined && data.length > max) {
      throw new PermanentError(
        `event of ${data.length} bytes is over the NATS server's max_payload of ${max} bytes: raise max_payload, or lower the publisher's maxPayloadBytes so such a payload is refused at publish`,
      );
    }
    const publish = session.js.publish(subject, data, {
      msgID: message.id,
      timeout: config.timeoutMs,
      headers,
    });
    try {
      // js.publish has its own timeout; the deadline only adds the abort signal, with room for that timeout.
      await withDeadline(publish, {
        signal: message.signal,
        timeoutMs: config.timeoutMs + 1000,
        what: `${what} publish ${subject}`,
      });
      health.ok();
    } catch (error) {
      const failure = classify(error, subject, () =>
        health.misconfigured(`no JetStream stream captures subject ${subject}`),
      );
      // A timeout or a dropped connection; an aborted handler says nothing about the broker.
      if (failure instanceof TransientError && !message.signal.aborted) health.unreachable(failure);
      throw failure;
    }
  };

  async function relayHealth(): Promise<RelayHealth> {
    try {
      const session = await connection.get();
      if (!session.connected) health.unreachable(new TransientError(`${what}: disconnected, reconnecting`));
      else await withDeadline(checkTarget(session), { timeoutMs: config.timeoutMs, what: `${what}: probe` });
    } catch (error) {
      health.unreachable(error);
    }
    return health.snapshot();
  }

  return { kind: "nats", handler, health: relayHealth, close: () => connection.close() };
}

/** The stream subject covering every queue's subject. */
export function streamSubjectFor(subject: string): string {
  const tokens = subject.split(".");
  return tokens
    .map((token, i) => {
      if (!token.includes(QUEUE_PLACEHOLDER)) return token;
      if (token !== QUEUE_PLACEHOLDER) {
        throw new OutboxConfigError(
          "relay.subject",
          `with a stream, ${QUEUE_PLACEHOLDER} must be a whole token`,
        );
      }
      // Queue names may hold dots, which only a trailing ">" matches.
      return i === tokens.length - 1 ? ">" : "*";
    })
    .join(".");
}

/**
 * The NATS headers of a message's event, per the CloudEvents NATS protocol binding (binary content mode,
 * §3.1.3): each attribute as `ce-<name>` (`datacontenttype` too: the binding keeps `Content-Type` to mark
 * structured mode), values percent-encoded. Message headers that are not attributes come first, so a
 * stray one named like an attribute header cannot replace the event's own.
 */
export function natsEventHeaders(message: MessageContext, naming: CloudEventNaming): MsgHdrs {
  return natsEventMessage(message, naming, "binary").headers;
}

/**
 * A message's event as NATS data and headers. Binary mode: the data is the payload's stored JSON text and
 * the attributes are headers ({@link natsEventHeaders}). Structured mode (the released binding, 1.0.2): the
 * data is the JSON event format with the payload spliced in byte for byte, `Content-Type` says so, and no
 * `ce-` header is sent. Either way the plain message headers and the W3C trace headers come along.
 */
export function natsEventMessage(
  message: MessageContext,
  naming: CloudEventNaming,
  mode: NatsRelayConfig["contentMode"],
): { data: Uint8Array; headers: MsgHdrs } {
  const attributes = cloudEventAttributes(message, naming);
  const headers = natsHeaders();
  for (const [name, value] of Object.entries(message.headers)) {
    // Nats-Expected-* and friends are JetStream instructions, not data: a stray one would fail every publish.
    if (!isEventAttribute(name) && !/^nats-/i.test(name)) headers.append(name, value);
  }
  if (mode === "structured") {
    headers.set("Content-Type", "application/cloudevents+json; charset=utf-8");
    traceHeaders(headers, attributes);
    return { data: Buffer.from(structuredEvent(attributes, message.rawPayload)), headers };
  }
  for (const [name, value] of binaryAttributes(attributes))
    headers.set(`ce-${name}`, encodeHeaderValue(value));
  headers.set("ce-datacontenttype", attributes.datacontenttype);
  traceHeaders(headers, attributes);
  // The stored JSON text, byte for byte: a re-serialised payload would round numbers beyond 2^53.
  return { data: Buffer.from(message.rawPayload), headers };
}

/** The plain W3C headers too, as the HTTP relay sends them: NATS tracing instrumentation reads those. */
function traceHeaders(headers: MsgHdrs, attributes: CloudEventAttributes): void {
  if (attributes.traceparent !== undefined)
    headers.set("traceparent", encodeHeaderValue(attributes.traceparent));
  if (attributes.tracestate !== undefined)
    headers.set("tracestate", encodeHeaderValue(attributes.tracestate));
}

function classify(error: unknown, subject: string, onNoStream: () => void): Error {
  if (error instanceof TransientError) return error;
  if (error instanceof NatsError) {
    if (error.code === ErrorCode.NoResponders) {
      onNoStream();
      return new TransientError(`nats: no stream captures subject ${subject}`, { cause: error });
    }
    if (
      error.code === ErrorCode.MaxPayloadExceeded ||
      error.code === ErrorCode.BadHeader ||
      error.api_error?.err_code === JS_MESSAGE_TOO_LARGE
    ) {
      return new PermanentError(`nats refused the message: ${error.message}`, { cause: error });
    }
  }
  return new TransientError(`nats publish to ${subject} failed`, { cause: error });
}

async function watchStatus(
  session: NatsSession,
  logger: RelayDeps["logger"],
  health: RelayHealthTracker,
): Promise<void> {
  for await (const status of session.nc.status()) {
    if (status.type === "disconnect") {
      session.connected = false;
      health.unreachable(new TransientError(`nats disconnected from ${String(status.data)}; reconnecting`));
      logger.warn("nats disconnected; reconnecting");
    } else if (status.type === "reconnect") {
      session.connected = true;
      health.reachable();
      logger.info("nats reconnected");
    }
  }
}

/** Names of the streams whose subjects capture `subject`. */
async function streamsCapturing(jsm: JetStreamManager, subject: string): Promise<string[]> {
  const names: string[] = [];
  for await (const name of jsm.streams.names(subject)) names.push(name);
  return names;
}

/**
 * Creates stream `name` for `subject` unless some stream already captures it. Answers the problem when the
 * name is taken by a stream that does not capture the subject (its owner's settings are left alone).
 */
async function ensureStream(
  jsm: JetStreamManager,
  name: string,
  subject: string,
): Promise<string | undefined> {
  if ((await streamsCapturing(jsm, subject)).length > 0) return undefined;
  try {
    await jsm.streams.add({ name, subjects: [subject] });
    return undefined;
  } catch (error) {
    if (!(error instanceof NatsError)) throw error;
    const code = error.api_error?.err_code;
    // Another worker may have created it between our look and our add.
    if ((await streamsCapturing(jsm, subject)).length > 0) return undefined;
    if (code === JS_STREAM_NAME_IN_USE) {
      return `JetStream stream ${name} exists but does not capture ${subject}: add the subject to it, or name another stream`;
    }
    if (code === JS_SUBJECTS_OVERLAP) {
      return `cannot create JetStream stream ${name} for ${subject}: its subjects overlap another stream's`;
    }
    throw error;
  }
}
