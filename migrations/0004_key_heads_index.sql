-- outbox:no-transaction
-- Rows written before the key-head trigger existed were all heads: put every keyed row with an earlier row
-- of its key in line. Row locks only; producers keep committing (the trigger already marks their rows).
UPDATE {{schema}}.messages AS m SET head = false
WHERE m.key IS NOT NULL AND m.head AND m.acquired_token IS NULL
  AND EXISTS (
    SELECT 1 FROM {{schema}}.messages AS p WHERE p.queue = m.queue AND p.key = m.key AND p.id < m.id
  );

-- The ready index holds heads only, so a fetch never walks a hot key's backlog; the rows waiting behind
-- their key's head have their own index (read only by queues that opt out of ordering). Built
-- CONCURRENTLY: producers never wait for it.
CREATE INDEX CONCURRENTLY IF NOT EXISTS messages_head_ready_idx ON {{schema}}.messages (queue, available_at, id)
  WHERE acquired_token IS NULL AND head;
CREATE INDEX CONCURRENTLY IF NOT EXISTS messages_waiting_idx ON {{schema}}.messages (queue, available_at, id)
  WHERE acquired_token IS NULL AND NOT head;
DROP INDEX CONCURRENTLY IF EXISTS {{schema}}.messages_ready_idx;
