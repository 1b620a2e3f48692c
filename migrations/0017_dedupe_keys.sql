-- Producer dedupe keys and cancel (issue 29). `publish(…, { dedupeKey })` is a no-op while a message of the
-- same queue and dedupe key is still in messages (pending: ready, scheduled, retrying or being delivered);
-- `cancel(queue, dedupe_key)` removes such a message unless a live lease holds it.
--
-- The column: nullable, no default, so a catalog change only (no rewrite, no scan). Its bound is a CHECK
-- added NOT VALID (no scan under the table lock) and validated by 0020, which also builds the partial
-- unique index CONCURRENTLY (the index publish's ON CONFLICT names; until 0020 has run, a publish with a
-- dedupe key fails, one without is untouched). Given up on after a moment behind a long transaction, as 0003.
SET LOCAL lock_timeout = '250ms';
ALTER TABLE {{schema}}.messages ADD COLUMN dedupe_key text NULL;
ALTER TABLE {{schema}}.messages ADD CONSTRAINT messages_dedupe_key_bounded
  CHECK (dedupe_key <> '' AND octet_length(dedupe_key) <= 1024) NOT VALID;

-- Cancel one pending message by (queue, dedupe key) in the caller's transaction → (status, id):
-- 'cancelled' (deleted), 'delivering' (a live lease holds it: kept, its handler runs or has run), or
-- 'not_found' (none pending, or only one another transaction has not committed yet).
-- SECURITY DEFINER with search_path pinned: a producer role cancels without DELETE on messages, and only
-- by dedupe key (a message published without one cannot be cancelled this way).
-- Locks in the order every completion takes them: the key's advisory lock first (waited for, as publish
-- waits for it: a producer of the key may be in flight), then the row (by the DELETE). Taking the row first
-- could deadlock with an ack that holds the key's lock and waits for the row.
CREATE FUNCTION {{schema}}.cancel(cancel_queue text, cancel_dedupe_key text)
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

-- Nobody but the owner calls it until `outbox-worker grant` gives it to the producer side; on a schema
-- granted before (PUBLIC's EXECUTE taken from every function), the roles that could insert messages (the
-- producers) get it now, as 0015 hands its new functions to the roles that could do the same before.
DO $$
DECLARE
  r regrole;
BEGIN
  REVOKE ALL ON FUNCTION {{schema}}.cancel(text, text) FROM PUBLIC;
  FOR r IN
    SELECT DISTINCT a.grantee::regrole FROM pg_attribute AS t, aclexplode(t.attacl) AS a
    WHERE t.attrelid = '{{schema}}.messages'::regclass AND t.attname = 'topic'
      AND a.privilege_type = 'INSERT' AND a.grantee <> 0
    UNION
    SELECT a.grantee::regrole FROM pg_class AS c, aclexplode(c.relacl) AS a
    WHERE c.oid = '{{schema}}.messages'::regclass AND a.privilege_type = 'INSERT' AND a.grantee <> 0
  LOOP
    EXECUTE format('GRANT EXECUTE ON FUNCTION {{schema}}.cancel(text, text) TO %s', r);
    EXECUTE format('GRANT INSERT (dedupe_key), SELECT (dedupe_key) ON {{schema}}.messages TO %s', r);
  END LOOP;
END
$$;
