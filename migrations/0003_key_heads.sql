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

-- The completion of keyed heads runs server-side: the statements need a fresh snapshot between them (the
-- promotion must see every row a producer of the key committed before the completion took the key's
-- lock), which one SQL statement cannot have, and a transaction from the client costs two more round trips.
-- Functions cache their plans.

-- The oldest row left of each key becomes its head; up to hand_off of them that are due are leased at once
-- under hand_token (a hand-off: the caller runs them next, without a fetch). Run after the heads' removal,
-- in the same transaction, holding the keys' locks.
CREATE FUNCTION {{schema}}.promote_heads(
  queues text[], keys text[], hand_off integer, hand_token uuid, lease_ttl_ms double precision, worker_id text
) RETURNS TABLE (
  id text, queue text, payload text, headers jsonb, key text, created_epoch double precision,
  deliveries_count integer, attempts_count integer, failures_count integer,
  first_attempt_at timestamptz, last_attempt_at timestamptz, taken boolean
)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
  RETURN QUERY
  WITH next AS (
    SELECT n.id, n.available_at <= now() AS due FROM unnest(queues, keys) AS k(queue, key)
    CROSS JOIN LATERAL (
      SELECT m.id, m.available_at FROM {{schema}}.messages AS m
      WHERE m.queue = k.queue AND m.key = k.key ORDER BY m.id LIMIT 1
    ) AS n
  ), ranked AS (
    SELECT x.id, x.due AND row_number() OVER (ORDER BY x.due DESC, x.id) <= hand_off AS take FROM next AS x
  )
  UPDATE {{schema}}.messages AS t
  SET head = true,
      -- A row someone already holds (a worker of an unordered queue) keeps its lease.
      acquired_token = CASE WHEN r.take AND t.acquired_token IS NULL THEN hand_token ELSE t.acquired_token END,
      acquired_at = CASE WHEN r.take AND t.acquired_token IS NULL THEN now() ELSE t.acquired_at END,
      lease_expires_at = CASE WHEN r.take AND t.acquired_token IS NULL
                              THEN now() + lease_ttl_ms * interval '1 millisecond'
                              ELSE t.lease_expires_at END,
      acquired_by = CASE WHEN r.take AND t.acquired_token IS NULL THEN worker_id ELSE t.acquired_by END,
      deliveries_count = t.deliveries_count + CASE WHEN r.take AND t.acquired_token IS NULL THEN 1 ELSE 0 END
  FROM ranked AS r
  WHERE t.id = r.id AND (NOT t.head OR (r.take AND t.acquired_token IS NULL))
  RETURNING t.id::text, t.queue, t.payload::text, t.headers, t.key, date_part('epoch', t.created_at),
            t.deliveries_count, t.attempts_count, t.failures_count, t.first_attempt_at, t.last_attempt_at,
            t.acquired_token IS NOT DISTINCT FROM hand_token;
END
$$;

-- Acknowledge deliveries (id, token) that may head a key, then promote (and hand off) the next row of each
-- key whose head went, in one call. A head's key lock is only tried: waiting could deadlock with a producer
-- taking several keys' locks, and would stall the batch behind a long producer transaction; a head whose
-- lock is busy stays (kind 'busy': try again shortly). Rows: 'deleted' (how many), 'written' per delivery
-- deleted (only when some were not: busy, or taken over), 'busy', and 'promoted' per new head (taken:
-- handed off).
CREATE FUNCTION {{schema}}.ack_keyed(
  ids bigint[], tokens uuid[], hand_off integer, hand_token uuid, lease_ttl_ms double precision,
  worker_id text, wait_for_flush boolean
) RETURNS TABLE (
  kind text, delivery text, id text, queue text, payload text, headers jsonb, key text,
  created_epoch double precision, deliveries_count integer, attempts_count integer, failures_count integer,
  first_attempt_at timestamptz, last_attempt_at timestamptz, taken boolean
)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
  deleted integer;
  written text[];
  head_queues text[];
  head_keys text[];
BEGIN
  IF NOT wait_for_flush THEN
    PERFORM set_config('synchronous_commit', 'off', true);
  END IF;
  WITH gone AS (
    DELETE FROM {{schema}}.messages AS t USING unnest(ids, tokens) AS d(id, token)
    WHERE t.id = d.id AND t.acquired_token = d.token
      AND (t.key IS NULL OR NOT t.head OR pg_try_advisory_xact_lock(hashtext(t.queue), hashtext(t.key)))
    RETURNING t.id::text || '/' || d.token::text AS delivery, t.queue, t.key, t.head
  )
  SELECT count(*), array_agg(g.delivery),
         array_agg(g.queue) FILTER (WHERE g.key IS NOT NULL AND g.head),
         array_agg(g.key) FILTER (WHERE g.key IS NOT NULL AND g.head)
  INTO deleted, written, head_queues, head_keys
  FROM gone AS g;
  RETURN QUERY SELECT 'deleted', deleted::text, NULL::text, NULL::text, NULL::text, NULL::jsonb, NULL::text,
                      NULL::float8, NULL::int, NULL::int, NULL::int, NULL::timestamptz, NULL::timestamptz,
                      NULL::boolean;
  IF deleted < cardinality(ids) THEN
    RETURN QUERY SELECT 'written', w, NULL::text, NULL::text, NULL::text, NULL::jsonb, NULL::text,
                        NULL::float8, NULL::int, NULL::int, NULL::int, NULL::timestamptz, NULL::timestamptz,
                        NULL::boolean
                 FROM unnest(written) AS w;
    -- This statement sees the deletions above: what is still ours and heads a key was busy.
    RETURN QUERY SELECT 'busy', t.id::text || '/' || t.acquired_token::text, NULL::text, NULL::text, NULL::text,
                        NULL::jsonb, NULL::text, NULL::float8, NULL::int, NULL::int, NULL::int,
                        NULL::timestamptz, NULL::timestamptz, NULL::boolean
                 FROM unnest(ids, tokens) AS b(id, token)
                 JOIN {{schema}}.messages AS t ON t.id = b.id AND t.acquired_token = b.token
                 WHERE t.key IS NOT NULL AND t.head;
  END IF;
  IF head_keys IS NOT NULL THEN
    RETURN QUERY SELECT 'promoted', NULL::text, p.*
                 FROM {{schema}}.promote_heads(head_queues, head_keys, hand_off, hand_token, lease_ttl_ms, worker_id) AS p;
  END IF;
END
$$;
