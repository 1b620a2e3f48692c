import type { MessageContext } from "./handler.js";

/**
 * A queue's inbox settings (`QueueConfig.inbox`): before the handler runs, the worker looks up the
 * (consumer, dedupe key) record; found, the message is acked without running the handler (outcome
 * `deduped`). After the handler succeeded, the record is written and committed before the ack.
 */
export interface InboxOptions<P = unknown> {
  /**
   * Whose record it is (default: the queue's name). Queues that share a consumer dedupe each other's
   * messages by the derived key; a renamed queue keeps its records by naming its old consumer.
   */
  consumer?: string;
  /**
   * The dedupe key of a message (default: its id). Derive it from the payload to dedupe two different
   * messages about the same business fact (e.g. `(p) => p.orderId`). A non-empty string of at most 1000
   * characters; a key that throws, or returns anything else, fails the attempt like a throwing handler.
   */
  key?: (payload: P, message: MessageContext) => string;
}

/** Longest dedupe key a key function may return (it is a primary-key column). */
export const MAX_INBOX_KEY_LENGTH = 1000;

/** A queue's inbox with its defaults filled in. */
export interface ResolvedInbox {
  consumer: string;
  key: ((payload: unknown, message: MessageContext) => string) | undefined;
}

/** One inbox record: `consumer` handled `key` (for message `id` of `queue`). */
export interface InboxRecord {
  readonly consumer: string;
  readonly key: string;
  readonly id: string;
  readonly queue: string;
}

/** What the dispatcher and the completer need of the inbox; the worker gives them the Postgres one. */
export interface InboxStore {
  /** Whether the record exists; rejects when the database cannot say (the delivery is then retried). */
  seen(record: InboxRecord): Promise<boolean>;
  /** Write the records, each committed before this resolves (existing ones are left as they are). */
  record(records: readonly InboxRecord[]): Promise<void>;
}
