-- A design not in the product, measured before building it: a key index without leased rows.
--
-- Today every lease of a keyed row writes a new entry into messages_key_idx (the lease is not a HOT
-- update: its columns are in the other indexes' predicates), and the promotion's descent walks the
-- deleted head's dead versions. With `AND acquired_token IS NULL` in the key index's predicate, a leased
-- version is not indexed by key at all: a keyed lease writes the same two index entries as a keyless one.
-- The price: nothing can find a leased head by its key any more, and the producer's trigger must (a key
-- whose only row is in flight). So a key's presence moves to its own table, key_heads: a row per key that
-- has rows, inserted by the first publish into an empty key, deleted by the promotion that finds no
-- successor. The trigger becomes one `INSERT … ON CONFLICT DO NOTHING`: inserted, the new row heads its key.
--
-- Applied by bench/job.ts to a drain's schema (`"variant": "unleased-key-index"`): the part before the
-- marker on the empty, migrated schema, so the index grows with the fill as the product's does; the part
-- after it once the fill is in (the fill bypasses the trigger). Not a migration: no upgrade path, and the
-- other writers of keyed rows (dead-letter moves, unordered queues, the head repair) are not adapted.

DROP INDEX {{schema}}.messages_key_idx;
CREATE INDEX messages_key_idx ON {{schema}}.messages (queue, key, id)
  WHERE key IS NOT NULL AND acquired_token IS NULL;

CREATE TABLE {{schema}}.key_heads (queue text NOT NULL, key text NOT NULL, PRIMARY KEY (queue, key));

CREATE OR REPLACE FUNCTION {{schema}}.mark_key_head() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_advisory_xact_lock(hashtext(NEW.queue), hashtext(NEW.key));
  INSERT INTO {{schema}}.key_heads (queue, key) VALUES (NEW.queue, NEW.key) ON CONFLICT DO NOTHING;
  NEW.head := FOUND;
  RETURN NEW;
END
$$;

-- The product's promote_heads (migration 0003) but for the successor lookup, which reads unleased rows
-- only, and the key_heads row of a key left without rows, deleted in the same statement.
CREATE OR REPLACE FUNCTION {{schema}}.promote_heads(
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
    SELECT k.queue, k.key, n.id, n.available_at <= now() AS due FROM unnest(queues, keys) AS k(queue, key)
    LEFT JOIN LATERAL (
      SELECT m.id, m.available_at FROM {{schema}}.messages AS m
      WHERE m.queue = k.queue AND m.key = k.key AND m.key IS NOT NULL AND m.acquired_token IS NULL
      ORDER BY m.id LIMIT 1
    ) AS n ON true
  ), ended AS (
    DELETE FROM {{schema}}.key_heads AS h USING next AS x
    WHERE x.id IS NULL AND h.queue = x.queue AND h.key = x.key
  ), ranked AS (
    SELECT x.id, x.due AND row_number() OVER (ORDER BY x.due DESC, x.id) <= hand_off AS take
    FROM next AS x WHERE x.id IS NOT NULL
  )
  UPDATE {{schema}}.messages AS t
  SET head = true,
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

-- after fill

INSERT INTO {{schema}}.key_heads (queue, key)
SELECT DISTINCT queue, key FROM {{schema}}.messages WHERE key IS NOT NULL;
ANALYZE {{schema}}.key_heads;
