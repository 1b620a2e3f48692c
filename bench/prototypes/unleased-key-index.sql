-- A design not in the product, measured before building it: a key index without leased rows.
--
-- Today every lease of a keyed row writes a new entry into messages_key_idx (the lease is not a HOT
-- update: its columns are in the other indexes' predicates). (When this was measured, in session 6, the
-- promotion's descent also walked the deleted head's dead versions; migration 0009 looks above them.)
-- With `AND acquired_token IS NULL` in the key index's predicate, a leased version is not indexed by key
-- at all: a keyed lease writes the same two index entries as a keyless one.
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

-- The product's promote_heads_after (migration 0009, as migrated into this schema), edited rather than
-- copied so that the two cannot drift apart: the successor lookup reads unleased rows only, and the key_heads row of
-- a key left without rows is deleted in the same statement. An edit whose text is not found stops here.
DO $$
DECLARE
  fn text := pg_get_functiondef(
    '{{schema}}.promote_heads_after(text[], text[], bigint[], integer, uuid, double precision, text)'::regprocedure
  );
  edits text[] := ARRAY[
    'SELECT n.id, n.available_at <= now() AS due FROM unnest(queues, keys, afters)',
    'SELECT k.queue, k.key, n.id, n.available_at <= now() AS due FROM unnest(queues, keys, afters)',
    'CROSS JOIN LATERAL (',
    'LEFT JOIN LATERAL (',
    'WHERE m.queue = k.queue AND m.key = k.key',
    'WHERE m.queue = k.queue AND m.key = k.key AND m.key IS NOT NULL AND m.acquired_token IS NULL',
    ') AS n',
    ') AS n ON true',
    '), ranked AS (',
    '), ended AS (
    DELETE FROM {{schema}}.key_heads AS h USING next AS x
    WHERE x.id IS NULL AND h.queue = x.queue AND h.key = x.key
  ), ranked AS (',
    'FROM next AS x',
    'FROM next AS x WHERE x.id IS NOT NULL'
  ];
BEGIN
  FOR i IN 1 .. array_length(edits, 1) BY 2 LOOP
    IF position(edits[i] IN fn) = 0 THEN
      RAISE EXCEPTION 'promote_heads_after no longer holds %: update this prototype', edits[i];
    END IF;
    fn := replace(fn, edits[i], edits[i + 1]);
  END LOOP;
  EXECUTE fn;
END
$$;

-- after fill

INSERT INTO {{schema}}.key_heads (queue, key)
SELECT DISTINCT queue, key FROM {{schema}}.messages WHERE key IS NOT NULL;
ANALYZE {{schema}}.key_heads;
