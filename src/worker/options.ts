import { hostname } from "node:os";
import pg from "pg";
import type { Logger } from "pino";
import { z } from "zod";
import { OutboxConfigError } from "../contract/errors.js";
import type {
  FailureAnnouncement,
  Handler,
  QueueConfig,
  ResolvedQueue,
  TransactionalHandler,
} from "../contract/handler.js";
import type { InboxOptions, ResolvedInbox } from "../contract/inbox.js";
import { type QueueDefinition, validateQueueName } from "../contract/queue.js";
import type { RetryStrategy } from "../contract/retry.js";
import { topicMatches, validateTopicName, validateTopicPattern } from "../contract/topic.js";
import { DEFAULT_SCHEMA, validateSchemaName } from "../sql/names.js";

const positiveMs = (max: number) => z.number().int().positive().max(max);

/**
 * The worker's tuning knobs: one schema shared by `createWorker` and the service config, so a field means
 * the same thing (and fails the same way) in code, in a config file and in an environment variable.
 */
export const workerTuningShape = {
  concurrency: z.number().int().min(1).max(10_000).default(10),
  batchSize: z.number().int().min(1).max(10_000).default(500),
  // Payload bytes fetched and held (queued, running, completing): 500 rows of 1 MB must not be one fetch.
  maxHeldBytes: z
    .number()
    .int()
    .min(65_536, "must be at least 65536 (64 KiB)")
    .max(2 ** 40, "must be at most 2^40 (1 TiB)")
    .default(32 * 2 ** 20),
  leaseTtlMs: z.number().int().min(1000).max(86_400_000).default(30_000),
  heartbeatMs: positiveMs(43_200_000).optional(),
  minPollIntervalMs: positiveMs(3_600_000).default(100),
  maxPollIntervalMs: positiveMs(3_600_000).default(2000),
  listen: z.boolean().default(true),
  synchronousCommit: z.boolean().default(false),
  preparedStatements: z.boolean().default(true),
  // "transaction": a batch's rows are locked by the transaction that leased them instead of a token written
  // on each (half the Postgres work per message; for fast handlers: a batch commits when its last row ends).
  leaseMode: z.enum(["token", "transaction"]).default("token"),
  queryTimeoutMs: z.number().int().min(100).max(3_600_000).optional(),
  handlerTimeoutMs: z.number().int().min(1).max(86_400_000).default(300_000),
  poolSize: z.number().int().min(2).max(1000).default(6),
  maxDeliveries: z.number().int().min(1).max(1_000_000).default(25),
  maxAttempts: z.number().int().min(1).max(1_000_000).default(10),
  completionBatchSize: z.number().int().min(1).max(10_000).default(1000),
  completionWindowMs: z.number().min(0).max(1000).default(1),
  maxConsecutiveFailures: z.number().int().min(1).max(1_000_000).default(30),
  loopBackoffBaseMs: positiveMs(60_000).default(100),
  loopBackoffMaxMs: positiveMs(600_000).default(10_000),
  stopTimeoutMs: z.number().int().min(0).max(3_600_000).default(30_000),
  keyHeadRepairIntervalMs: z.number().int().min(1000).max(86_400_000).default(60_000),
  maxErrorLength: z.number().int().min(100).max(1_000_000).default(4000),
  // How long a queue's inbox records are kept (only queues with `inbox` have any): a redelivery later
  // than this runs its handler again. From a minute to ten years; default 7 days.
  inboxRetentionMs: z
    .number()
    .int()
    .min(60_000, "must be at least 60000 (a minute)")
    .max(315_360_000_000, "must be at most 315360000000 (ten years)")
    .default(7 * 86_400_000),
};

export const workerTuningSchema = z.strictObject(workerTuningShape);
export type WorkerTuning = z.output<typeof workerTuningSchema>;

type TuningIssue = { path: (string | number)[]; message: string };

/** Cross-field checks of the tuning fields, with paths relative to the tuning object. */
export function tuningIssues(o: WorkerTuning): TuningIssue[] {
  const issues: TuningIssue[] = [];
  // The heartbeat must renew well before the lease runs out, or a slow handler is delivered twice.
  if (o.heartbeatMs !== undefined && o.heartbeatMs * 2 > o.leaseTtlMs) {
    issues.push({
      path: ["heartbeatMs"],
      message: `must be at most half of leaseTtlMs (${o.leaseTtlMs}), got ${o.heartbeatMs}`,
    });
  }
  // A round trip that may outlast the lease would let a wedged statement outlive the row's ownership.
  if (o.queryTimeoutMs !== undefined && o.queryTimeoutMs * 2 > o.leaseTtlMs) {
    issues.push({
      path: ["queryTimeoutMs"],
      message: `must be at most half of leaseTtlMs (${o.leaseTtlMs}), got ${o.queryTimeoutMs}`,
    });
  }
  if (o.minPollIntervalMs > o.maxPollIntervalMs) {
    issues.push({
      path: ["minPollIntervalMs"],
      message: `must not exceed maxPollIntervalMs (${o.maxPollIntervalMs}), got ${o.minPollIntervalMs}`,
    });
  }
  // A lost ack is redelivered one lease TTL later at the earliest: records must outlive that, and more.
  if (o.inboxRetentionMs < 2 * o.leaseTtlMs) {
    issues.push({
      path: ["inboxRetentionMs"],
      message: `must be at least twice leaseTtlMs (${o.leaseTtlMs}): a redelivery after a lost ack comes a lease later, got ${o.inboxRetentionMs}`,
    });
  }
  if (o.loopBackoffBaseMs > o.loopBackoffMaxMs) {
    issues.push({ path: ["loopBackoffBaseMs"], message: "must not exceed loopBackoffMaxMs" });
  }
  return issues;
}

const queueConfigSchema = z.strictObject({
  handler: z.custom<Handler>((v) => typeof v === "function", "must be a function"),
  schema: z.custom<z.ZodType>((v) => v instanceof z.ZodType, "must be a zod schema").optional(),
  retry: z
    .custom<RetryStrategy>((v) => typeof v === "function", "must be a retry strategy function")
    .optional(),
  maxAttempts: z.number().int().min(1).max(1_000_000).optional(),
  timeoutMs: z.number().int().min(1).max(86_400_000).optional(),
  rawPayload: z.boolean().optional(),
  ordered: z.boolean().optional(),
  subscribe: z.array(z.string(), "must be an array of topic names or patterns").readonly().optional(),
  transaction: z.boolean().optional(),
  // Checked in the options' superRefine: a problem here would surface as the queue's "Invalid input" (the
  // entry is a union of a handler and this object), without the field's name.
  announceFailures: z.custom<FailureAnnouncement>(() => true).optional(),
  // Checked in superRefine (inboxSchema): inside the handler-or-config union, zod would only say "Invalid input".
  inbox: z.custom<boolean | InboxOptions>(() => true).optional(),
});

const inboxObjectSchema = z.strictObject({
  consumer: z
    .string("must be a string")
    .min(1, "must be a non-empty string")
    .max(200, "must be at most 200 characters")
    .optional(),
  key: z
    .custom<InboxOptions["key"]>(
      (v) => typeof v === "function",
      "must be a function (payload, message) => string",
    )
    .optional(),
});

/** The problems of a queue's `inbox` value, with paths below it. */
function inboxIssues(inbox: unknown): TuningIssue[] {
  if (typeof inbox === "boolean") return [];
  if (typeof inbox !== "object" || inbox === null || Array.isArray(inbox)) {
    return [{ path: [], message: "must be true, false or { consumer?, key? }" }];
  }
  const parsed = inboxObjectSchema.safeParse(inbox);
  return (parsed.error?.issues ?? []).map((i) => ({
    path: i.path.filter((p): p is string | number => typeof p !== "symbol"),
    message: i.message,
  }));
}

const optionsSchema = z
  .strictObject({
    connection: z.union([
      z.string().min(1),
      z.custom<pg.Pool>((v) => v instanceof pg.Pool, "must be a connection string or a pg.Pool"),
    ]),
    /** Where LISTEN connects when `connection` is a Pool without a connectionString. */
    listenConnection: z.string().min(1).optional(),
    schema: z.string().default(DEFAULT_SCHEMA),
    queues: z
      .record(
        z.string(),
        z.union([
          z.custom<Handler>((v) => typeof v === "function", "must be a handler function"),
          queueConfigSchema,
        ]),
      )
      .refine((q) => Object.keys(q).length > 0, "serve at least one queue"),
    ...workerTuningShape,
    retry: z
      .custom<RetryStrategy>((v) => typeof v === "function", "must be a retry strategy function")
      .optional(),
    workerId: z.string().min(1).max(200).optional(),
    logger: z
      .custom<Logger | false>(
        (v) => v === false || (typeof v === "object" && v !== null && "info" in v),
        "must be a pino logger or false",
      )
      .optional(),
  })
  .superRefine((o, ctx) => {
    try {
      validateSchemaName(o.schema);
    } catch (error) {
      ctx.addIssue({ code: "custom", path: ["schema"], message: (error as OutboxConfigError).reason });
    }
    for (const [name, def] of Object.entries(o.queues)) {
      try {
        validateQueueName(name);
      } catch (error) {
        ctx.addIssue({
          code: "custom",
          path: ["queues", name],
          message: (error as OutboxConfigError).reason,
        });
      }
      if (typeof def === "object") {
        def.subscribe?.forEach((pattern, i) => {
          try {
            validateTopicPattern(pattern);
          } catch (error) {
            ctx.addIssue({
              code: "custom",
              path: ["queues", name, "subscribe", i],
              message: (error as OutboxConfigError).reason,
            });
          }
        });
      }
      if (typeof def === "object" && def.announceFailures !== undefined)
        for (const issue of announceIssues(name, def.announceFailures, def.subscribe ?? []))
          ctx.addIssue({ code: "custom", ...issue });
      if (typeof def === "object" && def.inbox !== undefined) {
        for (const issue of inboxIssues(def.inbox)) {
          ctx.addIssue({
            code: "custom",
            path: ["queues", name, "inbox", ...issue.path],
            message: issue.message,
          });
        }
      }
      // The inbox record must commit before the ack and apart from it; a transactional handler's ack commits
      // with its writes, so a record in that transaction would be lost with a lost ack, and one outside it
      // is a second commit per message that the ack transaction was chosen to avoid.
      if (typeof def === "object" && def.inbox && def.transaction) {
        ctx.addIssue({
          code: "custom",
          path: ["queues", name, "inbox"],
          message:
            "not with transaction: a transactional handler's writes commit with its ack already; keep outside effects in a queue of their own (a follow-up) with the inbox",
        });
      }
      // A transaction-held batch writes every outcome in its own transaction: a handler's transaction, or an
      // inbox record committed before the ack and apart from it, cannot be part of it.
      if (o.leaseMode === "transaction" && typeof def === "object") {
        for (const field of ["transaction", "inbox"] as const) {
          if (!def[field]) continue;
          ctx.addIssue({
            code: "custom",
            path: ["queues", name, field],
            message: `not with leaseMode "transaction": a transaction-held batch writes every outcome in its own transaction; give this queue a worker with leaseMode "token"`,
          });
        }
      }
      if (typeof def === "object" && def.rawPayload && def.schema) {
        ctx.addIssue({
          code: "custom",
          path: ["queues", name, "rawPayload"],
          message: "a raw payload is not validated: give rawPayload or schema, not both",
        });
      }
    }
    for (const issue of tuningIssues(o)) ctx.addIssue({ code: "custom", ...issue });
  });

/**
 * A queue's `announceFailures`: a valid queue or topic name, and never the queue itself (nor a topic it
 * subscribes to): a failure event that fails in turn would announce itself again, for ever.
 */
function announceIssues(queue: string, target: unknown, subscribe: readonly string[]): TuningIssue[] {
  const path = ["queues", queue, "announceFailures"];
  const keys = typeof target === "object" && target !== null ? Object.keys(target) : [];
  if (keys.length !== 1 || (keys[0] !== "queue" && keys[0] !== "topic"))
    return [{ path, message: 'must be { queue: "name" } or { topic: "name" }' }];
  try {
    if ("queue" in (target as object)) {
      const t = target as { queue: unknown };
      validateQueueName(t.queue, "queue");
      if (t.queue === queue)
        return [
          {
            path: [...path, "queue"],
            message: "must not be the queue itself: its failures would announce themselves",
          },
        ];
    } else {
      const topic = validateTopicName((target as { topic: unknown }).topic, "topic");
      const own = subscribe.find((pattern) => topicMatches(pattern, topic));
      if (own !== undefined)
        return [
          {
            path: [...path, "topic"],
            message: `must not be a topic this queue subscribes to (${JSON.stringify(own)}): its failures would announce themselves`,
          },
        ];
    }
  } catch (error) {
    const e = error as OutboxConfigError;
    return [{ path: [...path, e.field], message: e.reason }];
  }
  return [];
}

/**
 * Options of {@link createWorker}: `connection` (a connection string or a `pg.Pool`) and `queues` (queue
 * name → {@link Handler} or {@link QueueConfig}) are required; the rest (`schema`, `concurrency`,
 * `batchSize`, `leaseTtlMs`, `handlerTimeoutMs`, `maxAttempts`, `retry`, `workerId`, `logger`, …) have
 * defaults. Every field, its default and its bounds are in docs/guide/worker.md.
 */
export type WorkerOptions = z.input<typeof optionsSchema>;

/** One subscription a queue's `subscribe` asks for, and where it was given (for errors). */
export interface QueueSubscription {
  queue: string;
  pattern: string;
  /** `queues.billing.subscribe[0]` */
  field: string;
}

export type ResolvedOptions = Omit<
  z.output<typeof optionsSchema>,
  "queues" | "heartbeatMs" | "workerId" | "queryTimeoutMs"
> & {
  queues: Map<string, ResolvedQueue>;
  /** Every queue's `subscribe`, in queue then list order, each pattern once per queue. */
  subscriptions: QueueSubscription[];
  heartbeatMs: number;
  queryTimeoutMs: number;
  workerId: string;
};

let workersInProcess = 0;

/**
 * The host name (a pod's name on Kubernetes), so `acquired_by` names the same replica across its restarts;
 * a second worker in one process gets `#2`, and so on, in creation order.
 */
function defaultWorkerId(): string {
  workersInProcess++;
  return workersInProcess === 1 ? hostname() : `${hostname()}#${workersInProcess}`;
}

/**
 * The default bound on one database round trip: a third of the lease, at most 10 s. A statement stuck that
 * long is on a dead connection (a query of the worker takes milliseconds), and what it held is retried.
 */
export function defaultQueryTimeoutMs(leaseTtlMs: number): number {
  return Math.min(10_000, Math.floor(leaseTtlMs / 3));
}

/** A field as a user writes it: `queues.billing.subscribe[0]`. */
function fieldName(path: readonly PropertyKey[]): string {
  const text = path.map((p) => (typeof p === "number" ? `[${p}]` : `.${String(p)}`)).join("");
  return text.replace(/^\./, "") || "(options)";
}

/** Parse and cross-check worker options; every problem is reported with its field, before anything connects. */
export function resolveWorkerOptions(input: WorkerOptions): ResolvedOptions {
  const parsed = optionsSchema.safeParse(input);
  if (!parsed.success) {
    const problems = parsed.error.issues.map((i) => `${fieldName(i.path)}: ${i.message}`);
    const fields = [...new Set(parsed.error.issues.map((i) => fieldName(i.path)))].join(", ");
    throw new OutboxConfigError(
      fields,
      problems.join("; "),
      `invalid worker options: ${problems.join("; ")}`,
    );
  }
  const o = parsed.data;
  const queues = new Map<string, ResolvedQueue>();
  const subscriptions: QueueSubscription[] = [];
  for (const [name, def] of Object.entries(o.queues)) {
    const config = typeof def === "function" ? { handler: def as Handler } : def;
    const patterns = ("subscribe" in config ? config.subscribe : undefined) ?? [];
    patterns.forEach((pattern, i) => {
      if (patterns.indexOf(pattern) === i)
        subscriptions.push({ queue: name, pattern, field: `queues.${name}.subscribe[${i}]` });
    });
    queues.set(name, {
      name,
      handler: config.handler as Handler,
      schema: "schema" in config ? (config.schema as z.ZodType | undefined) : undefined,
      retry: "retry" in config ? config.retry : undefined,
      maxAttempts: ("maxAttempts" in config ? config.maxAttempts : undefined) ?? o.maxAttempts,
      timeoutMs: ("timeoutMs" in config ? config.timeoutMs : undefined) ?? o.handlerTimeoutMs,
      rawPayload: ("rawPayload" in config ? config.rawPayload : undefined) ?? false,
      ordered: ("ordered" in config ? config.ordered : undefined) ?? true,
      transaction: ("transaction" in config ? config.transaction : undefined) ?? false,
      announceFailures: "announceFailures" in config ? config.announceFailures : undefined,
      inbox: resolveInbox(name, "inbox" in config ? (config.inbox as QueueConfig["inbox"]) : undefined),
    });
  }
  return {
    ...o,
    queues,
    subscriptions,
    heartbeatMs: o.heartbeatMs ?? Math.max(250, Math.floor(o.leaseTtlMs / 3)),
    queryTimeoutMs: o.queryTimeoutMs ?? defaultQueryTimeoutMs(o.leaseTtlMs),
    workerId: o.workerId ?? defaultWorkerId(),
  };
}

/** A queue's `inbox` option with its defaults: consumer = the queue's name, key = the message id. */
function resolveInbox(queue: string, inbox: boolean | InboxOptions | undefined): ResolvedInbox | undefined {
  if (inbox === undefined || inbox === false) return undefined;
  if (inbox === true) return { consumer: queue, key: undefined };
  return { consumer: inbox.consumer ?? queue, key: inbox.key };
}

/**
 * A queue's handler typed by its definition: the worker validates payloads with the same zod schema the
 * producer used, and the handler receives the schema's output type.
 */
export function handle<I, O>(
  queue: QueueDefinition<I, O>,
  handler: Handler<O>,
  options: Omit<QueueConfig<O>, "handler" | "schema" | "rawPayload"> = {},
): QueueConfig {
  return {
    ...options,
    handler: handler as Handler,
    schema: queue.schema as z.ZodType | undefined,
    inbox: options.inbox as QueueConfig["inbox"],
  };
}

/** A queue's settings besides its handler, as {@link handleInTransaction} takes them. */
export type TransactionalQueueOptions<P> = Omit<QueueConfig<P>, "handler" | "schema" | "transaction">;

/**
 * A queue whose handler runs inside the transaction that acknowledges its message: `message.transaction`
 * is open, and what the handler writes through it (or through {@link transactionKysely}) commits together
 * with the token-fenced ack and the follow-ups, or not at all. With a queue definition first, payloads are
 * validated by its schema and typed, as {@link handle} does.
 *
 * @example
 * ```ts
 * queues: {
 *   "order.placed": handleInTransaction(orderPlaced, async (order, message) => {
 *     await message.transaction.query("INSERT INTO invoices (order_id) VALUES ($1)", [order.orderId]);
 *   }),
 * }
 * ```
 */
export function handleInTransaction<P = unknown>(
  handler: TransactionalHandler<P>,
  options?: TransactionalQueueOptions<P>,
): QueueConfig;
export function handleInTransaction<I, O>(
  queue: QueueDefinition<I, O>,
  handler: TransactionalHandler<O>,
  options?: Omit<TransactionalQueueOptions<O>, "rawPayload">,
): QueueConfig;
export function handleInTransaction(
  first: QueueDefinition<unknown, unknown> | TransactionalHandler,
  second?: TransactionalHandler | TransactionalQueueOptions<unknown>,
  third: TransactionalQueueOptions<unknown> = {},
): QueueConfig {
  if (typeof first === "function") {
    const options = (second ?? {}) as TransactionalQueueOptions<unknown>;
    return { ...options, handler: first as Handler, transaction: true };
  }
  return {
    ...third,
    handler: second as Handler,
    schema: first.schema as z.ZodType | undefined,
    transaction: true,
  };
}
