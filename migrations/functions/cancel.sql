-- cancel: its live definition, (re)applied by the migrator whenever this file changes (see
-- docs/contributing/migrations.md). Change the body here, never in a numbered migration.
--
-- Cancel one pending message by (queue, dedupe key) in the caller's transaction → (status, id):
-- 'cancelled' (deleted), 'delivering' (a live lease holds it: kept, its handler runs or has run), or
-- 'not_found' (none pending, or only one another transaction has not committed yet).
-- SECURITY DEFINER with search_path pinned: a producer role cancels without DELETE on messages, and only
-- by dedupe key (a message published without one cannot be cancelled this way).
-- Locks in the order every completion takes them: the key's advisory lock first (waited for, as publish
-- waits for it: a producer of the key may be in flight), then the row (by the DELETE). Taking the row first
-- could deadlock with an ack that holds the key's lock and waits for the row.
CREATE OR REPLACE FUNCTION {{schema}}.cancel(cancel_queue text, cancel_dedupe_key text)
RETURNS TABLE (status text, id bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
  found_id bigint;
  found_key text;
  gone_id bigint;
  gone_key text;
  gone_head boolean;
BEGIN
  -- Bounded: each round either ends or saw the row change under it (acked, or replaced by a new message
  -- with the same dedupe key) between its read and its delete.
  FOR attempt IN 1 .. 5 LOOP
    SELECT m.id, m.key INTO found_id, found_key FROM {{schema}}.messages AS m
    WHERE m.queue = cancel_queue AND m.dedupe_key = cancel_dedupe_key;
    IF found_id IS NULL THEN
      RETURN QUERY SELECT 'not_found'::text, NULL::bigint;
      RETURN;
    END IF;
    IF found_key IS NOT NULL THEN
      PERFORM pg_advisory_xact_lock(hashtext(cancel_queue), hashtext(found_key));
    END IF;
    -- A lease is live until lease_expires_at on the server clock: statement_timestamp(), not the caller's
    -- transaction start (now()), which may be long past. An expired lease's holder is fenced by its token:
    -- its late ack writes nothing.
    DELETE FROM {{schema}}.messages AS t
    WHERE t.id = found_id AND t.dedupe_key = cancel_dedupe_key
      AND (t.acquired_token IS NULL OR t.lease_expires_at <= statement_timestamp())
    RETURNING t.id, t.key, t.head INTO gone_id, gone_key, gone_head;
    IF gone_id IS NOT NULL THEN
      -- The key's successor becomes head as after an ack of the head: its own statement (a fresh snapshot
      -- seeing every row a producer of the key committed), holding the key's lock. No hand-off: nobody here
      -- runs handlers.
      IF gone_key IS NOT NULL AND gone_head THEN
        PERFORM count(*) FROM {{schema}}.promote_heads_after(
          ARRAY[cancel_queue], ARRAY[gone_key], ARRAY[gone_id], 0, NULL::uuid, 0, NULL::text);
      END IF;
      RETURN QUERY SELECT 'cancelled'::text, gone_id;
      RETURN;
    END IF;
    IF EXISTS (SELECT 1 FROM {{schema}}.messages AS t
               WHERE t.id = found_id AND t.dedupe_key = cancel_dedupe_key
                 AND t.acquired_token IS NOT NULL AND t.lease_expires_at > statement_timestamp()) THEN
      RETURN QUERY SELECT 'delivering'::text, found_id;
      RETURN;
    END IF;
    found_id := NULL;
  END LOOP;
  RAISE EXCEPTION USING ERRCODE = '40001',
    MESSAGE = 'outbox: cancel: the message kept changing under the cancel; try again';
END
$$;
