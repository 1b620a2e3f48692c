-- outbox:no-transaction
-- The rows published below a row of their key (0007), by key: nearly always empty, so the promotion's check
-- for them is one probe of an empty index. Built CONCURRENTLY: producers never wait for it.
CREATE INDEX CONCURRENTLY IF NOT EXISTS messages_below_head_idx ON {{schema}}.messages (queue, key, id)
  WHERE below_head;
