-- outbox:no-transaction
-- The index behind dedupe keys (0017): one pending message per (queue, dedupe key). Partial: a row without
-- a dedupe key has no entry, so publishes without one write nothing more than before. Built CONCURRENTLY:
-- producers never wait for it. A row given a duplicate key by plain SQL before the index existed keeps its
-- message but loses the key (the oldest keeps it), so the build cannot fail on it.
UPDATE {{schema}}.messages AS m SET dedupe_key = NULL
WHERE m.dedupe_key IS NOT NULL
  AND EXISTS (
    SELECT 1 FROM {{schema}}.messages AS o
    WHERE o.queue = m.queue AND o.dedupe_key = m.dedupe_key AND o.id < m.id
  );
CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS messages_dedupe_key_idx ON {{schema}}.messages (queue, dedupe_key)
  WHERE dedupe_key IS NOT NULL;
ALTER TABLE {{schema}}.messages VALIDATE CONSTRAINT messages_dedupe_key_bounded;
