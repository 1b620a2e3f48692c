import { z } from "zod";
import { OutboxConfigError } from "../contract/errors.js";
import { validateQueueName } from "../contract/queue.js";
import { validateTopicName, validateTopicPattern } from "../contract/topic.js";
import { signingKey } from "../wire/webhook-signature.js";

/** Where a relay's target names may say `{queue}`: replaced by the message's queue name. */
export const QUEUE_PLACEHOLDER = "{queue}";
/** Where a CloudEvents type may say `{topic}`: the topic a subscriber's copy was published to, else its queue. */
export const TOPIC_PLACEHOLDER = "{topic}";

const timeoutMs = (fallback: number) => z.number().int().min(1).max(600_000).default(fallback);

// One in flight per key: a consumer of the stream or queue sees each key's messages in publish order.
const ordered = z
  .boolean()
  .default(true)
  .describe(
    "same-key messages are relayed one at a time, in publish order; false: the key is plain metadata",
  );

// Applied by the service at start, like a handler queue's `subscribe`: add-only, never unsubscribes.
const subscribe = z
  .array(
    z.string().superRefine((pattern, ctx) => {
      try {
        validateTopicPattern(pattern);
      } catch (error) {
        ctx.addIssue({ code: "custom", message: (error as OutboxConfigError).reason });
      }
    }),
  )
  .optional()
  .describe(
    "topic names or patterns (`order.*`) the relay's queue subscribes to at start; removing one does not unsubscribe",
  );

// The relay's queue announces its failures like a handler queue's `announceFailures` (the worker refuses
// the relay's own queue as a target, naming the field).
const nameOf = (check: (name: string) => unknown) =>
  z.string().superRefine((name, ctx) => {
    try {
      check(name);
    } catch (error) {
      ctx.addIssue({ code: "custom", message: (error as OutboxConfigError).reason });
    }
  });
const announceFailures = z
  .union(
    [
      z.strictObject({ queue: nameOf(validateQueueName) }),
      z.strictObject({ topic: nameOf(validateTopicName) }),
    ],
    { error: 'must be {"queue": name} or {"topic": name}' },
  )
  .optional()
  .describe(
    '`{"queue": name}` or `{"topic": name}`: each dead-lettered message also publishes a failure event there, in the same transaction',
  );

// Every relay sends CloudEvents 1.0 (see src/relay/cloudevents.ts); these name them.
const eventSource = z
  .string()
  .min(1)
  .optional()
  .describe("CloudEvents `source` (a URI-reference); unset: `/outbox/<database>/<schema>`");
const eventType = z
  .string()
  .min(1)
  .default(TOPIC_PLACEHOLDER)
  .describe(
    "CloudEvents `type`; `{topic}` is replaced by the topic a message was published to (its queue when it was sent to the queue), `{queue}` by its queue",
  );

// An RFC 9110 token: a name fetch accepts, so a bad one fails at startup rather than on every message.
const headerName = z.string().regex(/^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/, "must be a valid HTTP header name");
const headerValue = z.string().regex(/^[\t\x20-\x7e\x80-\xff]*$/, "must not hold control characters");

// Shared with the consumer inbox, which verifies what the relay signs.
export { signingKey };

// The message never quotes the value: it is a secret.
const signingSecret = z
  .string()
  .refine(
    (s) => signingKey(s) !== null,
    "must be a Standard Webhooks secret: whsec_ followed by the base64 of a 24 to 64-byte random key",
  );

// Any value fails (unknown, so an old config still type-checks and stops at start with this message).
const replacedBySigningSecret = z
  .unknown()
  .refine((value) => value === undefined, {
    error:
      "was replaced by signingSecret (Standard Webhooks: webhook-id, webhook-timestamp, webhook-signature headers); set signingSecret to a whsec_<base64> secret",
  })
  .optional()
  .describe("removed: replaced by `signingSecret` (Standard Webhooks); setting it fails at start");

export const httpRelayConfigSchema = z.strictObject({
  type: z.literal("http"),
  url: z
    .url({ protocol: /^https?$/, error: "must be an http(s) URL" })
    // fetch refuses such URLs on every call; credentials belong in `headers` (authorization).
    .refine(
      (u) => !/^[a-z]+:\/\/[^/?#]*@/i.test(u),
      "must not hold credentials; send an authorization header",
    )
    .describe("the receiver's URL (no credentials in it: send them in `headers`)"),
  method: z.enum(["POST", "PUT"]).default("POST").describe("HTTP method"),
  timeoutMs: timeoutMs(10_000).describe("per request; a timeout is retried"),
  ordered,
  subscribe,
  announceFailures,
  eventSource,
  eventType,
  /** Static headers sent with every request; they cannot override the relay's own headers. */
  headers: z
    .record(headerName, headerValue)
    .optional()
    .describe("static headers for every request, e.g. authorization (masked in logs)"),
  signingSecret: z
    .union([signingSecret, z.array(signingSecret).min(1).max(10)], {
      error: "must be a whsec_<base64> secret, or a list of 1 to 10 of them",
    })
    .optional()
    .describe(
      "Standard Webhooks signing secret `whsec_<base64>` (a 24 to 64-byte key), or a list of them while rotating: each signs (`webhook-signature`)",
    ),
  // Removed (the old `x-outbox-signature` scheme): kept as fields that always fail, so an old config stops at
  // start saying what replaced them instead of "unrecognized key".
  hmacSecret: replacedBySigningSecret,
  hmacHeader: replacedBySigningSecret,
});

export const redisRelayConfigSchema = z.strictObject({
  type: z.literal("redis"),
  url: z
    .url({ protocol: /^rediss?$/, error: "must be a redis:// or rediss:// URL" })
    .default("redis://127.0.0.1:6379")
    .describe("Redis server"),
  stream: z.string().min(1).describe("stream key to XADD to; `{queue}` is replaced by the message's queue"),
  maxLen: z
    .number()
    .int()
    .min(1)
    .default(100_000)
    .describe("approximate cap on the stream's length (`MAXLEN ~`); older entries are trimmed"),
  timeoutMs: timeoutMs(5000).describe("connect and per-command timeout; a timeout is retried"),
  ordered,
  subscribe,
  announceFailures,
  eventSource,
  eventType,
});

export const natsRelayConfigSchema = z.strictObject({
  type: z.literal("nats"),
  servers: z
    .union([z.string().min(1), z.array(z.string().min(1)).min(1)])
    .default("nats://127.0.0.1:4222")
    .describe("NATS server URL, or a list of them"),
  subject: z
    .string()
    .regex(/^[^\s*>]+$/, "must be a subject without spaces or wildcards")
    .describe("subject to publish to; `{queue}` is replaced by the message's queue"),
  /** Created on connect unless a stream already captures the subject; an existing stream is never changed. */
  stream: z
    .string()
    .regex(/^[^\s.*>/\\]+$/, "must be a stream name without spaces, dots, slashes or wildcards")
    .optional()
    .describe(
      "JetStream stream created on connect for the subject, unless one already captures it; unset: a stream must capture it already",
    ),
  timeoutMs: timeoutMs(5000).describe("connect and per-publish timeout (waiting for the stream's ack)"),
  contentMode: z
    .enum(["binary", "structured"])
    .default("binary")
    .describe(
      "`binary`: the body is the payload, attributes are `ce-*` headers (the binding's current text); `structured`: the body is the JSON event format, `Content-Type: application/cloudevents+json` (the only mode of the released binding, 1.0.2)",
    ),
  ordered,
  subscribe,
  announceFailures,
  eventSource,
  eventType,
});

export const rabbitmqRelayConfigSchema = z.strictObject({
  type: z.literal("rabbitmq"),
  url: z
    .url({ protocol: /^amqps?$/, error: "must be an amqp:// or amqps:// URL" })
    .default("amqp://guest:guest@127.0.0.1:5672")
    .describe("RabbitMQ server"),
  exchange: z
    .string()
    .default("")
    .describe('exchange to publish to; "" is the default exchange (routing key = queue name)'),
  exchangeType: z
    .enum(["direct", "topic", "fanout", "headers"])
    .optional()
    .describe("declares the exchange (durable) with this type on connect; unset: it must exist"),
  routingKey: z.string().min(1).describe("routing key; `{queue}` is replaced by the message's queue"),
  /** A durable queue asserted on every connect, and bound to `exchange` with the routing key when set. */
  declareQueue: z
    .string()
    .min(1)
    .optional()
    .describe(
      "durable queue declared on connect and bound to the exchange with the routing key (`{queue}` as `#`)",
    ),
  timeoutMs: timeoutMs(10_000).describe("connect and per-publish timeout (waiting for the broker's confirm)"),
  headerPrefix: z
    .enum(["ce-", "cloudEvents_", "cloudEvents:"])
    .default("ce-")
    .describe(
      "prefix of the attribute headers: `ce-` (the RabbitMQ binding of Knative and the CloudEvents SDKs' AMQP 0-9-1 users), or the CloudEvents AMQP binding's `cloudEvents_` / `cloudEvents:`",
    ),
  ordered,
  subscribe,
  announceFailures,
  eventSource,
  eventType,
});

export const relayConfigSchema = z.discriminatedUnion("type", [
  httpRelayConfigSchema,
  redisRelayConfigSchema,
  natsRelayConfigSchema,
  rabbitmqRelayConfigSchema,
]);

/** What a user writes: defaults may be left out. */
export type RelayConfigInput = z.input<typeof relayConfigSchema>;
/** A parsed relay configuration, every default filled in. */
export type RelayConfig = z.output<typeof relayConfigSchema>;

export type HttpRelayConfig = z.output<typeof httpRelayConfigSchema>;
export type RedisRelayConfig = z.output<typeof redisRelayConfigSchema>;
export type NatsRelayConfig = z.output<typeof natsRelayConfigSchema>;
export type RabbitmqRelayConfig = z.output<typeof rabbitmqRelayConfigSchema>;

/**
 * Parse with one of the schemas above; every problem is reported with its field. zod's messages never
 * echo the input, so a secret or a URL password cannot leak into the error.
 */
export function parseRelayConfig<S extends z.ZodType>(
  schema: S,
  input: z.input<S>,
  field = "relay",
): z.output<S> {
  const parsed = schema.safeParse(input);
  if (parsed.success) return parsed.data;
  const problems = parsed.error.issues.map((i) => `${[field, ...i.path].join(".")}: ${i.message}`);
  const fields = [...new Set(parsed.error.issues.map((i) => [field, ...i.path].join(".")))].join(", ");
  throw new OutboxConfigError(fields, problems.join("; "), `invalid relay config: ${problems.join("; ")}`);
}

/** The name a message goes to, with `{queue}` replaced by its queue. */
export function renderTarget(template: string, queue: string): string {
  return template.replaceAll(QUEUE_PLACEHOLDER, queue);
}
