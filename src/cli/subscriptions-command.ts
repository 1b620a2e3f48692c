import { OutboxConfigError, OutboxError } from "../contract/errors.js";
import { validateQueueName } from "../contract/queue.js";
import { topicMatches, validateTopicName, validateTopicPattern } from "../contract/topic.js";
import { DEFAULT_SCHEMA, outboxNames } from "../sql/names.js";
import {
  listSubscriptions,
  type Subscription,
  subscribe,
  subscribersOf,
  unsubscribe,
} from "../subscribe/subscriptions.js";
import { parseCommandArgs, UsageError, withDatabase } from "./args.js";
import { cell, printJson, renderTable } from "./format.js";
import { type CliIo, print } from "./io.js";

const CONNECTION_HELP = `  --schema NAME        outbox schema (default: ${DEFAULT_SCHEMA}, or OUTBOX_SCHEMA)
  --database-url URL   Postgres connection string (default: DATABASE_URL)
  -h, --help           show this help`;

const PATTERN_HELP = `TOPIC is a topic name or a pattern of dot-separated segments: * stands for exactly one segment, # for
any number (order.placed, order.*, order.#, *.failed). Quote a pattern ('order.*') so the shell does not
expand it.`;

export const subscriptionsUsage = `Usage: outbox-worker subscriptions [--queue Q] [--topic TOPIC] [--json]
       outbox-worker subscriptions --for TOPIC [--json]
                                   [--schema NAME] [--database-url URL]

Which queues receive which topics: every subscription (pattern, queue, when it was created), by pattern
then queue. With --for, the queues an event published to TOPIC now would reach, each with the
patterns that bring it there (none: the event would be kept as a dead letter no_subscribers).

Options:
  --queue Q            only the subscriptions of this queue
  --topic TOPIC        only this pattern, exactly as subscribed (--topic 'order.*' does not list order.placed)
  --for TOPIC          a topic name (no wildcard): who receives an event published to it now
  --json               print JSON
${CONNECTION_HELP}`;

export const subscribeUsage = `Usage: outbox-worker subscribe TOPIC QUEUE [--schema NAME] [--database-url URL]

Subscribe QUEUE to TOPIC: every event published to a matching topic once this has committed gets a
copy in QUEUE, which is delivered, retried, ordered and dead-lettered on its own. Events published
before are not copied. Subscribing again changes nothing and says "already subscribed" (exit 0).

${PATTERN_HELP}

Needs the right to add subscriptions: the schema's owner has it, and outbox-worker grant gives it to
a worker role with --worker-can-subscribe.

Options:
${CONNECTION_HELP}`;

export const unsubscribeUsage = `Usage: outbox-worker unsubscribe TOPIC QUEUE [--schema NAME] [--database-url URL]

Remove QUEUE's subscription to TOPIC, exactly as it was subscribed (unsubscribing 'order.*' leaves a
subscription to order.placed in place). Events published once this has committed get no copy in QUEUE;
copies already queued stay and are delivered. Removing a subscription that is not there changes
nothing and says "was not subscribed" (exit 0).

${PATTERN_HELP}

Only the schema's owner may remove a subscription.

Options:
${CONNECTION_HELP}`;

const CONNECTION_OPTIONS = {
  schema: { type: "string" },
  "database-url": { type: "string" },
} as const;

/** A name validator's refusal as a command-line error (exit 2, with the usage), before connecting. */
function checked<T>(validate: () => T): T {
  try {
    return validate();
  } catch (error) {
    if (error instanceof OutboxConfigError) throw new UsageError(error.message);
    throw error;
  }
}

type Access = "subscribe" | "unsubscribe" | "read";

/** Who may do it: the grant test (test/cli/grant.test.ts) shows each side's rights on subscriptions. */
const WHO_MAY: Record<Access, string> = {
  subscribe:
    "run it as the schema's owner, or as a worker role granted outbox-worker grant --worker <role> --worker-can-subscribe",
  unsubscribe: "run it as the schema's owner (no granted role may remove a subscription)",
  read: "run it as the schema's owner, or as an inspector role (outbox-worker grant --inspector <role>)",
};

/** A missing right says who has it, a missing table what creates it; not only the driver's words. */
function explained(error: unknown, schema: string, access: Access): unknown {
  const code = (error as { code?: unknown } | null)?.code;
  let fix: string | undefined;
  if (code === "42501") fix = WHO_MAY[access];
  else if (code === "42P01") {
    fix = `no ${outboxNames(schema).subscriptions}: run outbox-worker migrate --schema ${schema} (topics need migration 0012)`;
  }
  return fix === undefined ? error : new OutboxError(`${(error as Error).message}: ${fix}`, { cause: error });
}

/** The two positionals TOPIC and QUEUE, checked before anything connects. */
function topicAndQueue(positionals: string[], verb: string): { pattern: string; queue: string } {
  const [topic, queue, ...extra] = positionals;
  if (topic === undefined || queue === undefined) {
    throw new UsageError(`${verb} needs a topic (or pattern) and a queue, e.g. ${verb} 'order.*' billing`);
  }
  if (extra.length > 0) throw new UsageError(`unexpected argument ${JSON.stringify(extra[0])}`);
  return {
    pattern: checked(() => validateTopicPattern(topic, "TOPIC")),
    queue: checked(() => validateQueueName(queue, "QUEUE")),
  };
}

export async function subscribeCommand(argv: string[], io: CliIo): Promise<number> {
  const { values, positionals } = parseCommandArgs(argv, CONNECTION_OPTIONS);
  if (values.help) {
    print(io, subscribeUsage);
    return 0;
  }
  const { pattern, queue } = topicAndQueue(positionals, "subscribe");
  const { created } = await withDatabase(values, io.env, "outbox-subscribe", (client, schema) =>
    subscribe(client, { topic: pattern, queue, schema }).catch((error) => {
      throw explained(error, schema, "subscribe");
    }),
  );
  print(
    io,
    created
      ? `subscribed queue ${queue} to ${pattern}: events published from now on get a copy in it`
      : `queue ${queue} is already subscribed to ${pattern}; nothing changed`,
  );
  return 0;
}

export async function unsubscribeCommand(argv: string[], io: CliIo): Promise<number> {
  const { values, positionals } = parseCommandArgs(argv, CONNECTION_OPTIONS);
  if (values.help) {
    print(io, unsubscribeUsage);
    return 0;
  }
  const { pattern, queue } = topicAndQueue(positionals, "unsubscribe");
  const { removed } = await withDatabase(values, io.env, "outbox-subscribe", (client, schema) =>
    unsubscribe(client, { topic: pattern, queue, schema }).catch((error) => {
      throw explained(error, schema, "unsubscribe");
    }),
  );
  print(
    io,
    removed
      ? `unsubscribed queue ${queue} from ${pattern}: events published from now on get no copy in it; copies already queued stay`
      : `queue ${queue} was not subscribed to ${pattern}; nothing changed`,
  );
  return 0;
}

export async function subscriptionsCommand(argv: string[], io: CliIo): Promise<number> {
  const { values, positionals } = parseCommandArgs(argv, {
    ...CONNECTION_OPTIONS,
    queue: { type: "string" },
    topic: { type: "string" },
    for: { type: "string" },
    json: { type: "boolean" },
  });
  if (values.help) {
    print(io, subscriptionsUsage);
    return 0;
  }
  if (positionals.length > 0) throw new UsageError(`unexpected argument ${JSON.stringify(positionals[0])}`);
  if (values.for !== undefined) {
    if (values.queue !== undefined || values.topic !== undefined) {
      throw new UsageError("--for cannot be combined with --queue or --topic");
    }
    const topic = checked(() => validateTopicName(values.for, "--for"));
    return receivers(values, topic, io);
  }
  const filter = {
    queue: values.queue === undefined ? undefined : checked(() => validateQueueName(values.queue, "--queue")),
    topic:
      values.topic === undefined ? undefined : checked(() => validateTopicPattern(values.topic, "--topic")),
  };
  const rows = await withDatabase(values, io.env, "outbox-subscriptions", (client, schema) =>
    listSubscriptions(client, { ...filter, schema }).catch((error) => {
      throw explained(error, schema, "read");
    }),
  );
  if (values.json) {
    printJson(
      io,
      rows.map((r) => ({ pattern: r.topic, queue: r.queue, created_at: r.createdAt })),
    );
  } else if (rows.length === 0) {
    print(io, "no subscriptions");
  } else {
    print(
      io,
      renderTable(
        [{ header: "PATTERN" }, { header: "QUEUE" }, { header: "CREATED" }],
        rows.map((r) => [cell(r.topic), cell(r.queue), r.createdAt.toISOString()]),
      ),
    );
  }
  return 0;
}

/**
 * Who receives `topic`: the queues from the database's own rule (subscribersOf, what fan_out uses), each
 * with the patterns of its subscriptions that match, so an operator sees why a queue is on the list.
 */
async function receivers(values: Parameters<typeof withDatabase>[0], topic: string, io: CliIo) {
  const { queues, all } = await withDatabase(values, io.env, "outbox-subscriptions", (client, schema) =>
    Promise.all([subscribersOf(client, topic, { schema }), listSubscriptions(client, { schema })])
      .then(([queues, all]) => ({ queues, all }))
      .catch((error) => {
        throw explained(error, schema, "read");
      }),
  );
  const via = (queue: string) =>
    all.filter((s: Subscription) => s.queue === queue && topicMatches(s.topic, topic)).map((s) => s.topic);
  const reached = queues.map((queue) => ({ queue, patterns: via(queue) }));
  if (values.json) {
    printJson(io, { topic, queues: reached });
  } else if (reached.length === 0) {
    print(
      io,
      `no queue subscribes to ${topic}: an event published to it now is kept as a dead letter (no_subscribers)`,
    );
  } else {
    const n = reached.length;
    print(io, `an event published to ${topic} now reaches ${n} queue${n === 1 ? "" : "s"}:`);
    print(
      io,
      renderTable(
        [{ header: "QUEUE" }, { header: "VIA" }],
        reached.map((r) => [cell(r.queue), cell(r.patterns.join(", "))]),
      ),
    );
  }
  return 0;
}
