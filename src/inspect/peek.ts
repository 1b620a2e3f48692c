import { OutboxConfigError } from "../contract/errors.js";
import { textProblem } from "../contract/storable-text.js";
import { type Executor, runQuery } from "../sql/executor.js";
import { outboxNames } from "../sql/names.js";
import {
  MESSAGE_STATES,
  type MessageState,
  type PeekRow as PeekedMessage,
  peekStatement,
} from "../sql/peek.js";

export type { MessageState, PeekRow as PeekedMessage } from "../sql/peek.js";
export { MESSAGE_STATES } from "../sql/peek.js";

export const DEFAULT_LIMIT = 20;
export const MAX_LIMIT = 1000;

/** Filters for {@link peekMessages}; every given field must match. */
export interface PeekOptions {
  /** Only this queue's messages. */
  queue?: string;
  /** Only messages in this state. */
  state?: MessageState;
  /** 1 to 1000, default 20. */
  limit?: number;
}

export function checkLimit(limit: number | undefined): number {
  if (limit === undefined) return DEFAULT_LIMIT;
  if (!Number.isInteger(limit) || limit < 1 || limit > MAX_LIMIT) {
    throw new OutboxConfigError("limit", `must be a whole number from 1 to ${MAX_LIMIT}, got ${limit}`);
  }
  return limit;
}

/** A filter that is either absent (null: matches everything) or a non-empty string Postgres can take. */
export function checkOptionalText(value: string | undefined, field = "queue"): string | null {
  if (value === undefined) return null;
  if (typeof value !== "string" || value.length === 0) {
    throw new OutboxConfigError(field, "must be a non-empty string");
  }
  // A NUL would fail the statement, and with it the caller's transaction when one is passed.
  const problem = textProblem(value);
  if (problem) throw new OutboxConfigError(field, problem);
  return value;
}

export function checkState(state: string | undefined): MessageState | null {
  if (state === undefined) return null;
  if (!(MESSAGE_STATES as readonly string[]).includes(state)) {
    throw new OutboxConfigError(
      "state",
      `must be one of ${MESSAGE_STATES.join(", ")}, got ${JSON.stringify(state)}`,
    );
  }
  return state as MessageState;
}

/**
 * Messages still to deliver, oldest first, from the `unprocessed` view. Lease-free: no row lock, no
 * counter bumped, never waits for a worker. For looking at what is stuck or waiting, not for consuming.
 *
 * @param db - a pg pool or client, or a Kysely instance
 * @param schema - the outbox schema, usually `"outbox"` ({@link DEFAULT_SCHEMA})
 */
export async function peekMessages(
  db: Executor,
  schema: string,
  options: PeekOptions = {},
): Promise<PeekedMessage[]> {
  return runQuery(db, peekStatement(outboxNames(schema)), {
    queue: checkOptionalText(options.queue),
    state: checkState(options.state),
    limit: checkLimit(options.limit),
  });
}
