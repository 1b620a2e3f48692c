import type pg from "pg";
import type { Logger } from "pino";
import { OutboxError } from "../contract/errors.js";
import { runQuery } from "../sql/executor.js";
import type { OutboxNames } from "../sql/names.js";
import { subscribeStatement } from "../sql/topics.js";
import type { QueueSubscription } from "./options.js";

/**
 * The `subscribe` lists of a worker's queues, applied at start: each missing subscription is created, one
 * that exists is left as it is (idempotent, so every replica and every restart may run it), and none is
 * ever removed, since a list without a pattern may just be an older replica's.
 */
export async function applySubscriptions(options: {
  pool: pg.Pool;
  names: OutboxNames;
  subscriptions: readonly QueueSubscription[];
  queryTimeoutMs: number;
  log: Logger;
}): Promise<void> {
  const { pool, names, log } = options;
  const statement = subscribeStatement(names);
  for (const s of options.subscriptions) {
    let created: boolean;
    try {
      const [row] = await runQuery(
        pool,
        statement,
        { pattern: s.pattern, queue: s.queue },
        { timeoutMs: options.queryTimeoutMs },
      );
      created = row?.created === true;
    } catch (error) {
      throw subscribeFailed(error, s, names);
    }
    // Only what changed: an existing subscription is every start's normal case, not news.
    if (created) log.info({ queue: s.queue, topic: s.pattern }, "subscribed queue to topic");
  }
}

/** What went wrong, with the field that asked for it; a missing right names the grant that gives it. */
function subscribeFailed(error: unknown, s: QueueSubscription, names: OutboxNames): Error {
  const code = (error as { code?: unknown } | null)?.code;
  const what = `cannot subscribe queue "${s.queue}" to "${s.pattern}" (${s.field})`;
  const reason = (error as Error)?.message ?? String(error);
  if (code === "42501") {
    return Object.assign(
      new OutboxError(
        `${what}: ${reason} (the worker's role may not add subscriptions to ${names.subscriptions}: outbox-worker grant --worker <role> --worker-can-subscribe gives it the right)`,
        { cause: error },
      ),
      { code },
    );
  }
  // 42P01: no subscriptions table, a schema migrated before topics existed.
  const hint =
    code === "42P01"
      ? ` (run \`outbox-worker migrate --schema ${names.schema}\`: topics need migration 0012)`
      : "";
  return Object.assign(new OutboxError(`${what}: ${reason}${hint}`, { cause: error }), { code });
}
