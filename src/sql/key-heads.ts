import { defineQuery, type Query } from "./executor.js";
import type { OutboxNames } from "./names.js";

/**
 * Gives each key of `queues` that has rows but no head its oldest row as head → the rows promoted.
 *
 * The worker's own completions never leave a key without a head; a head deleted another way does: by hand
 * (`DELETE FROM outbox.messages WHERE id = …`), or acknowledged by a worker of a version before per-key
 * ordering during a rolling upgrade. Reads the rows waiting behind a head (messages_behind_idx) with one
 * index probe each (messages_key_idx), so it runs every minute, not per fetch. A row with an earlier row
 * of its key, or whose key has a head, is left alone (a replayed dead letter waits behind the head in
 * flight). Concurrent completions are harmless: both would promote the same oldest row.
 */
export function repairKeyHeadsStatement(names: OutboxNames): Query<{ queues: string[] }, { id: string }> {
  const m = names.messages;
  return defineQuery(
    "repair_key_heads",
    `UPDATE ${m} AS s SET head = true
WHERE s.queue = ANY ($1::text[]) AND s.acquired_token IS NULL AND NOT s.head
  AND NOT EXISTS (SELECT 1 FROM ${m} AS p WHERE p.queue = s.queue AND p.key = s.key AND p.id < s.id)
  AND NOT EXISTS (SELECT 1 FROM ${m} AS h WHERE h.queue = s.queue AND h.key = s.key AND h.head)
RETURNING s.id::text AS id`,
    (p) => [p.queues],
  );
}
