import { defineQuery, type Query } from "./executor.js";
import type { OutboxNames } from "./names.js";
import { type StatementSettings, settingsJoin, withSettings } from "./settings.js";

/**
 * The worker inbox's statements (migration 0016): the check before a handler runs, the record after it
 * succeeded, and the retention's batch. Only queues configured with `inbox` ever run them.
 */

/** Parallel arrays: `consumers[i]` handled `keys[i]`. */
export interface InboxKeysParams {
  consumers: readonly string[];
  keys: readonly string[];
}

/** A (consumer, dedupe key) the inbox holds. */
export interface InboxKeyRow {
  consumer: string;
  dedupe_key: string;
}

/** The records to write, one per handled message. */
export interface InboxRecordParams extends InboxKeysParams {
  ids: readonly string[];
  queues: readonly string[];
}

/** Per queue: records one retention batch deleted. */
export interface InboxExpireRow {
  queue: string;
  deleted: number;
}

export interface InboxStatements {
  /** Which of the (consumer, key) pairs have a record: one primary-key probe each. */
  seen: Query<InboxKeysParams, InboxKeyRow>;
  /**
   * Write a batch's records in one statement, committed on its own (autocommit) before that batch's ack.
   * ON CONFLICT DO NOTHING: a batch written again after a failure, or two deliveries of one message that
   * both ran, leave the first record as it was.
   */
  record: Query<InboxRecordParams, never>;
  /** One retention batch, through expire_inbox (as the schema's owner): oldest first, SKIP LOCKED. */
  expire: Query<{ olderThanMs: number; limit: number }, InboxExpireRow>;
}

export function inboxStatements(names: OutboxNames, settings: StatementSettings): InboxStatements {
  return {
    seen: defineQuery(
      "inbox_seen",
      `SELECT i.consumer, i.dedupe_key
FROM unnest($1::text[], $2::text[]) AS c(consumer, dedupe_key)
JOIN ${names.inbox} AS i ON i.consumer = c.consumer AND i.dedupe_key = c.dedupe_key`,
      (p) => [p.consumers, p.keys],
    ),
    record: defineQuery(
      "inbox_record",
      `${withSettings(settings, false)}INSERT INTO ${names.inbox} (consumer, dedupe_key, message_id, queue)
SELECT r.consumer, r.dedupe_key, r.message_id, r.queue
FROM unnest($1::text[], $2::text[], $3::bigint[], $4::text[]) AS r(consumer, dedupe_key, message_id, queue)${settingsJoin(settings)}
ON CONFLICT (consumer, dedupe_key) DO NOTHING`,
      (p) => [p.consumers, p.keys, p.ids, p.queues],
    ),
    expire: defineQuery(
      "inbox_expire",
      `SELECT queue, deleted FROM ${names.quotedSchema}.expire_inbox($1::double precision, $2::int)`,
      (p) => [p.olderThanMs, p.limit],
    ),
  };
}
