import { z } from "zod";
import { OutboxConfigError, OutboxError, OutboxPayloadError } from "../contract/errors.js";
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
import type {
  CancelResult,
  DedupedPublish,
  DedupePublishOptions,
  PublishOptions,
} from "../contract/publish-options.js";
import type { QueueDefinition } from "../contract/queue.js";
import type { TopicDefinition } from "../contract/topic.js";
import { type Executor, isExecutor, run } from "../sql/executor.js";
import { DEFAULT_SCHEMA, outboxNames } from "../sql/names.js";
import { type CancelRow, type DedupeRow, type InsertedRow, produceStatements } from "../sql/produce.js";
import { type CopyRow, topicStatements } from "../sql/topics.js";
import { NotifyThrottle } from "../util/notify-throttle.js";
import { loadTracing, tracingLoaded } from "../util/tracing.js";

export type { CancelResult, DedupedPublish, DedupePublishOptions, PublishOptions };

/** One message of a `publishMany` batch: its payload and its own options. */
export interface PublishItem<P> extends PublishOptions {
  payload: P;
}

/** One message of a `publishMany` batch with a dedupe key: its payload and its own options. */
export interface DedupePublishItem<P> extends DedupePublishOptions {
  payload: P;
}

/**
 * Rounds of a dedupe insert before giving up: a round comes back empty only when the message it collided
 * with committed while it waited (its snapshot cannot see it); the next sees it, or finds it delivered and
 * inserts. More rounds mean the key's messages are published and delivered faster than it can look.
 */
const DEDUPE_ROUNDS = 5;

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
        /** A fixed window; unset: 2 ms up to 1,000 publishes a second per queue, growing to 8 ms at 2,000. */
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
  /**
   * Insert one message in the caller's transaction. Returns its id; with a `dedupeKey`, a
   * {@link DedupedPublish}: while a message of the queue with that key is pending, nothing is inserted and
   * its id comes back with `deduplicated: true`. A producer whose same-key message is not yet committed
   * makes this call wait for its transaction (then: its id, or the insert if it rolled back).
   */
  publish<I, O>(
    trx: Executor,
    queue: QueueRef<I, O>,
    payload: I,
    options: DedupePublishOptions,
  ): Promise<DedupedPublish>;
  /** Insert one message in the caller's transaction. Returns its id. */
  publish<I, O>(trx: Executor, queue: QueueRef<I, O>, payload: I, options?: PublishOptions): Promise<string>;
  /**
   * Insert many messages of one queue in one statement. Returns their ids in input order; when every item
   * has a `dedupeKey`, a {@link DedupedPublish} per item (an item repeating an earlier item's key is a
   * duplicate of it). Items with and without a dedupe key cannot share a batch.
   */
  publishMany<I, O>(
    trx: Executor,
    queue: QueueRef<I, O>,
    items: readonly DedupePublishItem<I>[],
  ): Promise<DedupedPublish[]>;
  /** Insert many messages of one queue in one statement. Returns their ids in input order. */
  publishMany<I, O>(
    trx: Executor,
    queue: QueueRef<I, O>,
    items: readonly PublishItem<I>[],
  ): Promise<string[]>;
  /**
   * Remove the pending message of `queue` with `dedupeKey`, in the caller's transaction, unless a worker
   * holds it (a live lease, or in leaseMode "transaction" its batch's transaction: `delivering`, kept;
   * answered at once, never after the handler). A removed head of an ordered key hands its turn to the
   * key's next message, as an ack does; a removed keyed message keeps its key's lock until the caller's
   * transaction ends, as a publish of the key does.
   */
  cancel<I, O>(trx: Executor, queue: QueueRef<I, O>, dedupeKey: string): Promise<CancelResult>;
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

    publish: publishOne as Publisher["publish"],
    publishMany: publishBatch as Publisher["publishMany"],

    async cancel(trx, queueRef, dedupeKey) {
      const queue = resolveQueue(queueRef).name;
      checkDedupeKey(queue, dedupeKey);
      const [row] = await run<CancelRow>(trx, sql.cancel, [queue, dedupeKey], statementOptions);
      if (!row) throw new OutboxError("outbox cancel returned no row");
      if (row.status === "not_found" || row.id === null) return { status: "not_found" };
      return { status: row.status, id: row.id };
    },

    async publishToTopic(trx, topicRef, payload, opts) {
      if (!tracingLoaded()) await loadTracing();
      const m = prepareTopicMessage(topicRef, payload, opts, config.maxPayloadBytes);
      const [event] = await fanOut(trx, m.queue, [m]);
      if (!event) throw new OutboxError("outbox fan-out returned no event");
      return event;
    },

    async publishManyToTopic(trx, topicRef, items) {
      const topic = resolveTopic(topicRef).topic;
      if (items.length === 0) return [];
      if (!tracingLoaded()) await loadTracing();
      return fanOut(trx, topic, prepareTopicBatch(topicRef, items, config.maxPayloadBytes));
    },
  };

  async function publishOne<I, O>(
    trx: Executor,
    queueRef: QueueRef<I, O>,
    payload: I,
    opts?: PublishOptions | DedupePublishOptions,
  ): Promise<string | DedupedPublish> {
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
    let wake = throttle?.claim(m.queue) ?? false;
    const dedupeKey = opts?.dedupeKey;
    if (dedupeKey === undefined) {
      const rows = wake
        ? await run<InsertedRow>(trx, sql.insertOneNotify, [...values, names.channel], statementOptions)
        : await run<InsertedRow>(trx, sql.insertOne, values, statementOptions);
      const id = rows[0]?.id;
      if (id === undefined) throw new OutboxError("outbox insert returned no id");
      return String(id);
    }
    for (let round = 1; round <= DEDUPE_ROUNDS; round++) {
      const rows = wake
        ? await run<DedupeRow>(
            trx,
            sql.insertOneDedupeNotify,
            [...values, dedupeKey, names.channel],
            statementOptions,
          )
        : await run<DedupeRow>(trx, sql.insertOneDedupe, [...values, dedupeKey], statementOptions);
      wake = false;
      const row = rows.find((r) => r.id !== null);
      if (row?.id != null) return { id: String(row.id), deduplicated: row.existing };
    }
    throw dedupeChurn(m.queue);
  }

  async function publishBatch<I, O>(
    trx: Executor,
    queueRef: QueueRef<I, O>,
    items: readonly (PublishItem<I> | DedupePublishItem<I>)[],
  ): Promise<string[] | DedupedPublish[]> {
    const queue = resolveQueue(queueRef).name;
    if (items.length === 0) return [];
    if (!tracingLoaded()) await loadTracing();
    const prepared = prepareBatch(queueRef, items, config.maxPayloadBytes);
    const keyed = items.filter((item) => item.dedupeKey !== undefined).length;
    let wake = throttle?.claim(queue) ?? false;
    if (keyed === 0) {
      const batch = `[${prepared.map((m) => encodeItem(m)).join(",")}]`;
      const rows = wake
        ? await run<InsertedRow>(trx, sql.insertManyNotify, [queue, batch, names.channel], statementOptions)
        : await run<InsertedRow>(trx, sql.insertMany, [queue, batch], statementOptions);
      if (rows.length !== items.length)
        throw new OutboxError(`outbox insert returned ${rows.length} ids for ${items.length} rows`);
      return rows.map((r) => String(r.id));
    }
    if (keyed !== items.length) {
      const index = items.findIndex((item) => item.dedupeKey === undefined);
      throw new OutboxPayloadError(
        queue,
        "dedupeKey: give every item of a batch a dedupeKey, or none (the answer is a DedupedPublish per item, or an id per item)",
        { field: "dedupeKey", index },
      );
    }
    // The first item with a key is the one written; a later one with the same key is its duplicate.
    const keys = items.map((item) => item.dedupeKey as string);
    const first = new Map<string, number>();
    keys.forEach((key, i) => {
      if (!first.has(key)) first.set(key, i);
    });
    const answers = new Map<string, DedupedPublish>();
    let pending = [...first.keys()];
    for (let round = 1; round <= DEDUPE_ROUNDS && pending.length > 0; round++) {
      const batch = `[${pending.map((key) => encodeItem(prepared[first.get(key) as number] as PreparedMessage, key)).join(",")}]`;
      const rows = wake
        ? await run<DedupeRow>(
            trx,
            sql.insertManyDedupeNotify,
            [queue, batch, pending, names.channel],
            statementOptions,
          )
        : await run<DedupeRow>(trx, sql.insertManyDedupe, [queue, batch, pending], statementOptions);
      wake = false;
      for (const row of rows)
        if (row.id !== null && row.dedupe_key !== undefined)
          answers.set(row.dedupe_key, { id: String(row.id), deduplicated: row.existing });
      pending = pending.filter((key) => !answers.has(key));
    }
    if (pending.length > 0) throw dedupeChurn(queue);
    return keys.map((key, i) => {
      const answer = answers.get(key) as DedupedPublish;
      return first.get(key) === i ? answer : { id: answer.id, deduplicated: true };
    });
  }

  async function fanOut(
    trx: Executor,
    topic: string,
    prepared: PreparedMessage[],
  ): Promise<PublishedEvent[]> {
    const batch = `[${prepared.map((m) => encodeItem(m)).join(",")}]`;
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

function encodeItem(m: PreparedMessage, dedupeKey?: string): string {
  const dedupe = dedupeKey === undefined ? "" : `,"dedupe_key":${JSON.stringify(dedupeKey)}`;
  return `{"payload":${m.payloadText},"headers":${JSON.stringify(m.headers)},"key":${JSON.stringify(m.key)},"available_at":${JSON.stringify(m.availableAt?.toISOString() ?? null)},"delay_ms":${m.delayMs ?? 0}${dedupe}}`;
}

function dedupeChurn(queue: string): OutboxError {
  return new OutboxError(
    `outbox: publish to ${queue}: the message with this dedupe key was replaced ${DEDUPE_ROUNDS} times while publishing; try again`,
  );
}

/** `cancel`'s key is checked as a publish's `dedupeKey` is, before any statement runs. */
function checkDedupeKey(queue: string, dedupeKey: string): void {
  prepareMessage(queue, null, { dedupeKey }, Number.MAX_SAFE_INTEGER);
}

let defaultPublisher: Publisher | undefined;

/**
 * Publish with the default publisher (schema `outbox`, throttled in-transaction wake-ups). Returns the id;
 * with a `dedupeKey`, a {@link DedupedPublish} (see {@link Publisher.publish}).
 */
export function publish<I, O>(
  trx: Executor,
  queue: QueueRef<I, O>,
  payload: I,
  options: DedupePublishOptions,
): Promise<DedupedPublish>;
export function publish<I, O>(
  trx: Executor,
  queue: QueueRef<I, O>,
  payload: I,
  options?: PublishOptions,
): Promise<string>;
export function publish<I, O>(
  trx: Executor,
  queue: QueueRef<I, O>,
  payload: I,
  options?: PublishOptions | DedupePublishOptions,
): Promise<string | DedupedPublish> {
  defaultPublisher ??= createPublisher();
  return (defaultPublisher.publish as (...args: unknown[]) => Promise<string | DedupedPublish>)(
    trx,
    queue,
    payload,
    options,
  );
}

/** Cancel a pending message by its dedupe key with the default publisher (see {@link Publisher.cancel}). */
export function cancel<I, O>(trx: Executor, queue: QueueRef<I, O>, dedupeKey: string): Promise<CancelResult> {
  defaultPublisher ??= createPublisher();
  return defaultPublisher.cancel(trx, queue, dedupeKey);
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

/** Batch publish with the default publisher (see {@link Publisher.publishMany}). */
export function publishMany<I, O>(
  trx: Executor,
  queue: QueueRef<I, O>,
  items: readonly DedupePublishItem<I>[],
): Promise<DedupedPublish[]>;
export function publishMany<I, O>(
  trx: Executor,
  queue: QueueRef<I, O>,
  items: readonly PublishItem<I>[],
): Promise<string[]>;
export function publishMany<I, O>(
  trx: Executor,
  queue: QueueRef<I, O>,
  items: readonly (PublishItem<I> | DedupePublishItem<I>)[],
): Promise<string[] | DedupedPublish[]> {
  defaultPublisher ??= createPublisher();
  return (defaultPublisher.publishMany as (...args: unknown[]) => Promise<string[] | DedupedPublish[]>)(
    trx,
    queue,
    items,
  );
}
