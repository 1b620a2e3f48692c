-- cancel: its live definition, (re)applied by the migrator whenever this file changes (see
-- docs/contributing/migrations.md). Change the body here, never in a numbered migration.
--
-- Cancel one pending message by (queue, dedupe key) in the caller's transaction → (status, id):
-- 'cancelled' (deleted), 'delivering' (a worker holds it: a live lease, a transaction-held batch, or a
-- worker taking it right now; kept, its handler runs or has run), or 'not_found' (none pending, or only one
-- another transaction has not committed yet).
-- SECURITY DEFINER with search_path pinned: a producer role cancels without DELETE on messages, and only
-- by dedupe key (a message published without one cannot be cancelled this way).
-- Never waits for a row lock, so never for a batch's handlers: a transaction-held batch (leaseMode
-- "transaction") keeps its rows locked from its lease to the commit that writes their outcomes; a row
-- still locked is held (or being taken) by a worker, and deleting it once free could delete a row whose
-- handler ran. The only waits are for an advisory lock, holding nothing of this cancel's meanwhile: the
-- key's (a producer of the key in flight, a cancel of the key's rows not committed yet, or a completion
-- writing the key's outcomes just before its commit: never held across a handler), or for a keyless
-- message its dedupe key's (another cancel of it not committed yet). The lock is kept only with a deletion
-- (until the caller's commit, as publish keeps the key's); otherwise it is released at once (its
-- subtransaction rolls back), so a worker's keyed ack never finds the key busy because of a cancel that
-- deleted nothing.
CREATE OR REPLACE FUNCTION {{schema}}.cancel(cancel_queue text, cancel_dedupe_key text)
RETURNS TABLE (status text, id bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
  found_id bigint;
  found_key text;
  found_held boolean;
  gone_id bigint;
  gone_key text;
  gone_head boolean;
BEGIN
  -- Bounded: each round either ends or saw the row go (acked, or replaced by a new message with the same
  -- dedupe key) between its read and its lock.
  FOR attempt IN 1 .. 5 LOOP
    -- A lease is live until lease_expires_at on the server clock: statement_timestamp(), not the caller's
    -- transaction start (now()), which may be long past. An expired lease's holder is presumed dead (a
    -- fetch would take the row over) and is fenced by its token: its late ack writes nothing.
    SELECT m.id, m.key, m.acquired_token IS NOT NULL AND m.lease_expires_at > statement_timestamp()
    INTO found_id, found_key, found_held
    FROM {{schema}}.messages AS m
    WHERE m.queue = cancel_queue AND m.dedupe_key = cancel_dedupe_key;
    IF found_id IS NULL THEN
      RETURN QUERY SELECT 'not_found'::text, NULL::bigint;
      RETURN;
    END IF;
    -- Held by a live lease, or by a batch whose transaction is in progress (its guard names the row): the
    -- answer needs no lock, and the key's lock is left to the worker's ack.
    IF found_held OR EXISTS (SELECT 1 FROM {{schema}}.batch_leased() AS b WHERE b.id = found_id) THEN
      RETURN QUERY SELECT 'delivering'::text, found_id;
      RETURN;
    END IF;
    BEGIN
      -- Locks in the order every completion takes them: the key's lock, then the row. The key's lock is
      -- waited for (a producer of the key may be in flight: a promotion now could miss its row) holding
      -- nothing of this cancel's; the row is only tried (SKIP LOCKED): a row a worker locks is its own.
      -- A keyless message has no key lock: its dedupe key's own one (apart from the key locks: 'cancel '
      -- salts the queue's hash) makes a second cancel of it wait for the first one's transaction, so that
      -- the row lock of a cancel's deletion is never taken for a worker's.
      IF found_key IS NOT NULL THEN
        PERFORM pg_advisory_xact_lock(hashtext(cancel_queue), hashtext(found_key));
      ELSE
        PERFORM pg_advisory_xact_lock(hashtext('cancel ' || cancel_queue), hashtext(cancel_dedupe_key));
      END IF;
      PERFORM 1 FROM {{schema}}.messages AS t
      WHERE t.id = found_id AND t.dedupe_key = cancel_dedupe_key
        AND (t.acquired_token IS NULL OR t.lease_expires_at <= statement_timestamp())
      FOR UPDATE OF t SKIP LOCKED;
      IF NOT FOUND THEN
        -- Locked by another transaction, leased meanwhile, or gone: this round took nothing (the key's
        -- lock goes with the subtransaction).
        RAISE EXCEPTION USING ERRCODE = 'OXC01';
      END IF;
      DELETE FROM {{schema}}.messages AS t WHERE t.id = found_id
      RETURNING t.id, t.key, t.head INTO gone_id, gone_key, gone_head;
      -- The key's successor becomes head as after an ack of the head: its own statement (a fresh snapshot
      -- seeing every row a producer of the key committed), holding the key's lock. No hand-off: nobody here
      -- runs handlers.
      IF gone_key IS NOT NULL AND gone_head THEN
        PERFORM count(*) FROM {{schema}}.promote_heads_after(
          ARRAY[cancel_queue], ARRAY[gone_key], ARRAY[gone_id], 0, NULL::uuid, 0, NULL::text);
      END IF;
      RETURN QUERY SELECT 'cancelled'::text, gone_id;
      RETURN;
    EXCEPTION WHEN SQLSTATE 'OXC01' THEN
      NULL;
    END;
    -- Still there: a worker holds it or is taking it (a batch whose guard is not committed yet, a fetch, a
    -- completion of its lease). Gone: look again (acked, or a new message with the key).
    IF EXISTS (SELECT 1 FROM {{schema}}.messages AS t
               WHERE t.id = found_id AND t.dedupe_key = cancel_dedupe_key) THEN
      RETURN QUERY SELECT 'delivering'::text, found_id;
      RETURN;
    END IF;
    found_id := NULL;
  END LOOP;
  RAISE EXCEPTION USING ERRCODE = '40001',
    MESSAGE = 'outbox: cancel: the message kept changing under the cancel; try again';
END
$$;
