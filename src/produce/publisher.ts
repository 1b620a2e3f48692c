import { z } from "zod";
import { OutboxConfigError } from "../contract/errors.js";
import { DEFAULT_MAX_PAYLOAD_BYTES } from "../contract/payload.js";
import {
  type PreparedMessage,
  prepareBatch,
  prepareMessage,
  prepareTopicBatch,
  prepareTopicMessage,
  resolveQueue,
  resolveTopic,
} from "../contract/prepare-message.js";
import type { PublishOptions } from "../contract/publish-options.js";
import type { QueueDefinition } from "../contract/queue.js";
import type { TopicDefinition } from "../contract/topic.js";
import { type Executor, isExecutor, run } from "../sql/executor.js";
import { DEFAULT_SCHEMA, outboxNames } from "../sql/names.js";
import { type InsertedRow, produceStatements } from "../sql/produce.js";
import { type CopyRow, topicStatements } from "../sql/topics.js";
import { NotifyThrottle } from "../util/notify-throttle.js";
import { loadTracing, tracingLoaded } from "../util/tracing.js";

export type { PublishOptions };

/** One message of a `publishMany` batch: its payload and its own options. */
export interface PublishItem<P> extends PublishOptions {
  payload: P;
}

const publisherOptionsSchema = z.strictObject({
  schema: z.string().default(DEFAULT_SCHEMA),
  maxPayloadBytes: z.number().int().positive().default(DEFAULT_MAX_PAYLOAD_BYTES),
  /**
   * Named prepared statements on the caller's connection. Off by default: `publish` runs on whatever
   * connection the caller hands it, and behind a transaction-mode pooler (PgBouncer) a named statement
   * prepared on one server connection is missing, or already there, on the next.
   */
  preparedStatements: z.boolean().default(false),
  notify: z
    .union([
      z.boolean(),
      z.strictObject({
        /** A fixed window; unset: the window adapts between 2 and 8 ms with how dense publishes are. */
        cooldownMs: z.number().min(0).max(60_000).optional(),
        connection: z
          .custom<Executor>(isExecutor, "must be a pg Pool/Client or a Kysely instance")
          .optional(),
      }),
    ])
    .default(true),
});

const DEFAULT_COOLDOWN_MS = 2;
const MAX_ADAPTIVE_COOLDOWN_MS = 8;

/**
 * Options of {@link createPublisher}, all optional: `schema` (default `"outbox"`), `maxPayloadBytes`
 * (larger payloads are refused), `preparedStatements` (default off, safe behind PgBouncer) and `notify`
 * (wake-up notifications: `true` by default, throttled per queue; `false` leaves workers to poll).
 */
export type PublisherOptions = z.input<typeof publisherOptionsSchema>;

type QueueRef<I, O> = QueueDefinition<I, O> | string;

/** What publishing one event to a topic wrote: one message per subscribed queue, in queue-name order. */
export interface PublishedEvent {
  topic: string;
  /** Empty when no queue subscribes: the event was kept as a dead letter `no_subscribers` instead. */
  messages: { queue: string; id: string }[];
}

/** Writes outbox rows in the caller's transaction; made by {@link createPublisher}. */
export interface Publisher {
  /** The outbox schema it writes to. */
  readonly schema: string;
  /** Insert one message in the caller's transaction. Returns its id. */
  publish<I, O>(trx: Executor, queue: QueueRef<I, O>, payload: I, options?: PublishOptions): Promise<string>;
  /** Insert many messages of one queue in one statement. Returns their ids in input order. */
  publishMany<I, O>(
    trx: Executor,
    queue: QueueRef<I, O>,
    items: readonly PublishItem<I>[],
  ): Promise<string[]>;
  /**
   * Publish one event to a topic in the caller's transaction: one message per queue subscribed to it (as
   * the subscriptions stand when the statement runs), all committed or rolled back with the caller's work.
   * With no subscriber the event is kept as a dead letter `no_subscribers`, never dropped.
   */
  publishToTopic<I, O>(
    trx: Executor,
    topic: TopicDefinition<I, O> | string,
    payload: I,
    options?: PublishOptions,
  ): Promise<PublishedEvent>;
  /** Publish many events to one topic in one statement. Returns what each wrote, in input order. */
  publishManyToTopic<I, O>(
    trx: Executor,
    topic: TopicDefinition<I, O> | string,
    items: readonly PublishItem<I>[],
  ): Promise<PublishedEvent[]>;
}

/**
 * A publisher writes outbox rows through whatever transaction the caller hands it (Kysely or pg), so the
 * message commits or rolls back with the business row. Nothing is sent until that commit.
 */
export function createPublisher(options: PublisherOptions = {}): Publisher {
  const parsed = publisherOptionsSchema.safeParse(options);
  if (!parsed.success) {
    const issue = parsed.error.issues[0];
    throw new OutboxConfigError(issue?.path.join(".") || "options", issue?.message ?? "invalid");
  }
  const config = parsed.data;
  const names = outboxNames(config.schema);
  const sql = produceStatements(names);
  const topicSql = topicStatements(names);
  const statementOptions = { prepared: config.preparedStatements };
  const notify = config.notify === true ? { cooldownMs: undefined, connection: undefined } : config.notify;
  const trailingConnection = notify ? notify.connection : undefined;
  const throttle = notify
    ? new NotifyThrottle({
        // Sparse publishes notify at once; a window that covered several doubles, up to 8 ms.
        ...(notify.cooldownMs === undefined
          ? { cooldownMs: DEFAULT_COOLDOWN_MS, maxCooldownMs: MAX_ADAPTIVE_COOLDOWN_MS }
          : { cooldownMs: notify.cooldownMs }),
        trailing: trailingConnection
          ? (target) => {
              // A lost hint costs latency only: the worker's poll still finds the rows.
              const topic = target.startsWith(TOPIC_WINDOW) ? target.slice(TOPIC_WINDOW.length) : undefined;
              const [text, values] =
                topic === undefined
                  ? [sql.notify, [names.channel, target]]
                  : [sql.notifyTopic, [names.channel, topic]];
              run(trailingConnection, text, values, statementOptions).catch(() => {});
            }
          : undefined,
      })
    : undefined;

  return {
    schema: names.schema,

    async publish(trx, queueRef, payload, opts) {
      // Once per process: the optional OpenTelemetry API, imported on first use.
      if (!tracingLoaded()) await loadTracing();
      // Every refusal is thrown here, before a statement could fail and abort the caller's transaction.
      const m = prepareMessage(queueRef, payload, opts, config.maxPayloadBytes);
      const values: unknown[] = [
        m.queue,
        m.payloadText,
        JSON.stringify(m.headers),
        m.key,
        m.availableAt,
        m.delayMs ?? 0,
      ];
      const wake = throttle?.claim(m.queue) ?? false;
      const rows = wake
        ? await run<InsertedRow>(trx, sql.insertOneNotify, [...values, names.channel], statementOptions)
        : await run<InsertedRow>(trx, sql.insertOne, values, statementOptions);
      const id = rows[0]?.id;
      if (id === undefined) throw new Error("outbox insert returned no id");
      return String(id);
    },

    async publishMany(trx, queueRef, items) {
      const queue = resolveQueue(queueRef).name;
      if (items.length === 0) return [];
      if (!tracingLoaded()) await loadTracing();
      const prepared = prepareBatch(queueRef, items, config.maxPayloadBytes);
      const batch = `[${prepared.map(encodeItem).join(",")}]`;
      const wake = throttle?.claim(queue) ?? false;
      const rows = wake
        ? await run<InsertedRow>(trx, sql.insertManyNotify, [queue, batch, names.channel], statementOptions)
        : await run<InsertedRow>(trx, sql.insertMany, [queue, batch], statementOptions);
      if (rows.length !== items.length)
        throw new Error(`outbox insert returned ${rows.length} ids for ${items.length} rows`);
      return rows.map((r) => String(r.id));
    },

    async publishToTopic(trx, topicRef, payload, opts) {
      if (!tracingLoaded()) await loadTracing();
      const m = prepareTopicMessage(topicRef, payload, opts, config.maxPayloadBytes);
      const [event] = await fanOut(trx, m.queue, [m]);
      if (!event) throw new Error("outbox fan-out returned no event");
      return event;
    },

    async publishManyToTopic(trx, topicRef, items) {
      const topic = resolveTopic(topicRef).topic;
      if (items.length === 0) return [];
      if (!tracingLoaded()) await loadTracing();
      return fanOut(trx, topic, prepareTopicBatch(topicRef, items, config.maxPayloadBytes));
    },
  };

  async function fanOut(
    trx: Executor,
    topic: string,
    prepared: PreparedMessage[],
  ): Promise<PublishedEvent[]> {
    const batch = `[${prepared.map(encodeItem).join(",")}]`;
    // Throttled per topic: the subscribers' queues are learnt from the statement's own result.
    const wake = throttle?.claim(`${TOPIC_WINDOW}${topic}`) ?? false;
    const rows = wake
      ? await run<CopyRow>(trx, topicSql.fanOutNotify, [topic, batch, names.channel], statementOptions)
      : await run<CopyRow>(trx, topicSql.fanOut, [topic, batch], statementOptions);
    const events: PublishedEvent[] = prepared.map(() => ({ topic, messages: [] }));
    for (const row of rows)
      events[Number(row.ord) - 1]?.messages.push({ queue: row.queue, id: String(row.id) });
    return events;
  }
}

/** Throttle windows of topics are kept apart from queues' by this prefix (a queue name cannot hold it). */
const TOPIC_WINDOW = "#topic ";

function encodeItem(m: PreparedMessage): string {
  return `{"payload":${m.payloadText},"headers":${JSON.stringify(m.headers)},"key":${JSON.stringify(m.key)},"available_at":${JSON.stringify(m.availableAt?.toISOString() ?? null)},"delay_ms":${m.delayMs ?? 0}}`;
}

let defaultPublisher: Publisher | undefined;

/** Publish with the default publisher (schema `outbox`, throttled in-transaction wake-ups). */
export function publish<I, O>(trx: Executor, queue: QueueRef<I, O>, payload: I, options?: PublishOptions) {
  defaultPublisher ??= createPublisher();
  return defaultPublisher.publish(trx, queue, payload, options);
}

/** Publish one event to a topic with the default publisher. */
export function publishToTopic<I, O>(
  trx: Executor,
  topic: TopicDefinition<I, O> | string,
  payload: I,
  options?: PublishOptions,
): Promise<PublishedEvent> {
  defaultPublisher ??= createPublisher();
  return defaultPublisher.publishToTopic(trx, topic, payload, options);
}

/** Publish many events to one topic with the default publisher. */
export function publishManyToTopic<I, O>(
  trx: Executor,
  topic: TopicDefinition<I, O> | string,
  items: readonly PublishItem<I>[],
): Promise<PublishedEvent[]> {
  defaultPublisher ??= createPublisher();
  return defaultPublisher.publishManyToTopic(trx, topic, items);
}

/** Batch publish with the default publisher. */
export function publishMany<I, O>(trx: Executor, queue: QueueRef<I, O>, items: readonly PublishItem<I>[]) {
  defaultPublisher ??= createPublisher();
  return defaultPublisher.publishMany(trx, queue, items);
}
