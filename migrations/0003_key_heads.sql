-- Per-key ordering: a keyed row may be leased only while it is the head of its key (no earlier row of the
-- same queue and key is still in messages). Quick on a live table: the column has a constant default (no
-- rewrite), and the table lock is held only for this transaction's catalog changes. Rows written before
-- this migration are put in line, and the heads-only index is built, by the next one, without a table lock.
-- Behind a long transaction on messages, the lock request would queue every producer behind it: give up
-- after a moment instead (the migrator retries the whole migration after a pause).
SET LOCAL lock_timeout = '250ms';
ALTER TABLE {{schema}}.messages ADD COLUMN head boolean NOT NULL DEFAULT true;

-- Runs for keyed rows only. The advisory lock on (queue, key) is held until the producer commits: producers
-- of one key are serialised (ids follow commit order when the lock is taken before the id, as `publish`
-- does), and a completion that removes the key's head takes the same lock, so a row marked "not head"
-- here can never miss its promotion (the completion either sees it committed or waits for it).
-- A volatile function's query takes a fresh snapshot: it sees the rows of the producer that held the lock.
CREATE FUNCTION {{schema}}.mark_key_head() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_advisory_xact_lock(hashtext(NEW.queue), hashtext(NEW.key));
  NEW.head := NOT EXISTS (
    SELECT 1 FROM {{schema}}.messages AS m WHERE m.queue = NEW.queue AND m.key = NEW.key
  );
  RETURN NEW;
END
$$;

CREATE TRIGGER messages_key_head BEFORE INSERT ON {{schema}}.messages
  FOR EACH ROW WHEN (NEW.key IS NOT NULL) EXECUTE FUNCTION {{schema}}.mark_key_head();

-- 'blocked': waiting behind an earlier message of its key (on an ordered queue).
CREATE OR REPLACE VIEW {{schema}}.unprocessed AS
SELECT
  m.id,
  m.queue,
  m.key,
  CASE
    WHEN m.acquired_token IS NULL AND NOT m.head THEN 'blocked'
    WHEN m.acquired_token IS NULL AND m.available_at > now() THEN 'scheduled'
    WHEN m.acquired_token IS NULL THEN 'ready'
    WHEN m.lease_expires_at <= now() THEN 'lease_expired'
    ELSE 'leased'
  END AS state,
  now() - m.created_at AS age,
  m.payload,
  m.headers,
  m.created_at,
  m.available_at,
  m.acquired_at,
  m.acquired_by,
  m.lease_expires_at,
  m.deliveries_count,
  m.attempts_count,
  m.first_attempt_at,
  m.last_attempt_at,
  m.last_error,
  m.failures_count,
  m.head
FROM {{schema}}.messages AS m;
