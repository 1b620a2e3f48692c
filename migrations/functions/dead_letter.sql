-- dead_letter: its live definition, (re)applied by the migrator whenever this file changes (see
-- docs/contributing/migrations.md). Change the body here, never in a numbered migration.
--
-- The dead-letter move of the worker, ONE statement as before (DELETE … RETURNING → INSERT), token-guarded:
-- a delivery moves only while it holds the lease (id, token). A head of its key moves only if its key's lock
-- is taken (tried, never waited for: a producer of the key may be in flight), else it stays (`busy`); the
-- caller then promotes the successors of `head_keys` in the same transaction (promote_heads). Answers one
-- row: `keys` the deliveries moved (null when all were), `busy`, and the heads removed.
-- SECURITY DEFINER with search_path pinned: the caller chooses the reason and the error, never the content.
-- `no_subscribers` is fan_out's alone: replay fans such a dead letter out to every subscriber of its topic.
-- The zero token fences rows no lease names: deliveries held by their leasing transaction's row lock
-- (leaseMode "transaction"); a lease's random token never equals it.
CREATE OR REPLACE FUNCTION {{schema}}.dead_letter(
  ids bigint[], tokens uuid[], reasons text[], errors text[], attempted_flags integer[],
  failed_flags integer[], max_error_length integer, wait_for_flush boolean
) RETURNS TABLE (keys text[], busy text[], head_queues text[], head_keys text[])
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
BEGIN
  IF 'no_subscribers' = ANY (reasons) THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = 'outbox: dead_letter: reason no_subscribers is kept for events no queue subscribes to';
  END IF;
  IF NOT wait_for_flush THEN
    PERFORM set_config('synchronous_commit', 'off', true);
  END IF;
  RETURN QUERY
  WITH mine AS MATERIALIZED (
    SELECT d.*, t.queue AS lock_queue, t.key AS lock_key, t.head AS lock_head
    FROM unnest(ids, tokens, reasons, errors, attempted_flags, failed_flags)
      AS d(id, token, reason, error, attempted, failed)
    JOIN {{schema}}.messages AS t ON t.id = d.id AND COALESCE(t.acquired_token, '00000000-0000-0000-0000-000000000000'::uuid) = d.token
  ), kept AS MATERIALIZED (
    -- Materialised: the lock is tried on the deliveries' own rows only, once each.
    SELECT k.*, k.lock_key IS NOT NULL AND k.lock_head AS locked FROM mine AS k
    WHERE k.lock_key IS NULL OR NOT k.lock_head
       OR pg_try_advisory_xact_lock(hashtext(k.lock_queue), hashtext(k.lock_key))
  ), gone AS (
    DELETE FROM {{schema}}.messages AS t USING kept AS d
    WHERE t.id = d.id AND COALESCE(t.acquired_token, '00000000-0000-0000-0000-000000000000'::uuid) = d.token AND (t.key IS NULL OR NOT t.head OR d.locked)
    RETURNING t.id, t.queue, t.payload, t.headers, t.key, t.created_at, t.available_at, t.acquired_by,
              t.deliveries_count, t.attempts_count, t.failures_count, t.first_attempt_at, t.last_attempt_at,
              t.last_error, t.head, t.id::text || '/' || COALESCE(t.acquired_token, '00000000-0000-0000-0000-000000000000'::uuid)::text AS delivery,
              d.reason, d.error,
              -- Counts of one delivery: whether a handler ran and failed, nothing more.
              least(greatest(d.attempted, 0), 1) AS attempted, least(greatest(d.failed, 0), 1) AS failed
  ), moved AS (
    INSERT INTO {{schema}}.dead_letters AS dl
      (id, queue, payload, headers, key, created_at, available_at, acquired_by, deliveries_count,
       attempts_count, failures_count, first_attempt_at, last_attempt_at, dead_at, reason, error)
    SELECT g.id, g.queue, g.payload, g.headers, g.key, g.created_at, g.available_at, g.acquired_by,
           g.deliveries_count, LEAST(g.attempts_count, 2147483646) + g.attempted,
           LEAST(g.failures_count, 2147483646) + g.failed,
           CASE WHEN g.attempted > 0 THEN COALESCE(g.first_attempt_at, now()) ELSE g.first_attempt_at END,
           CASE WHEN g.attempted > 0 THEN now() ELSE g.last_attempt_at END,
           now(), g.reason, left(COALESCE(g.error, g.last_error), max_error_length)
    FROM gone AS g
    -- A replayed message that dies again replaces its earlier dead letter instead of failing the move.
    ON CONFLICT (id) DO UPDATE SET
      queue = excluded.queue, payload = excluded.payload, headers = excluded.headers, key = excluded.key,
      created_at = excluded.created_at, available_at = excluded.available_at,
      acquired_by = excluded.acquired_by, deliveries_count = excluded.deliveries_count,
      attempts_count = excluded.attempts_count, failures_count = excluded.failures_count,
      first_attempt_at = excluded.first_attempt_at, last_attempt_at = excluded.last_attempt_at,
      dead_at = excluded.dead_at, reason = excluded.reason, error = excluded.error
  )
  -- Only when some delivery was not moved: which are still ours as heads (busy). The rows gone are still
  -- visible to this statement's snapshot, so they are excluded by id.
  SELECT CASE WHEN count(*) < cardinality(ids) THEN COALESCE(array_agg(g.delivery), '{}') END,
         CASE WHEN count(*) < cardinality(ids) THEN (
           SELECT COALESCE(array_agg(t.id::text || '/' || COALESCE(t.acquired_token, '00000000-0000-0000-0000-000000000000'::uuid)::text), '{}')
           FROM unnest(ids, tokens) AS b(id, token)
           JOIN {{schema}}.messages AS t ON t.id = b.id AND COALESCE(t.acquired_token, '00000000-0000-0000-0000-000000000000'::uuid) = b.token
           WHERE t.key IS NOT NULL AND t.head AND t.id NOT IN (SELECT x.id FROM gone AS x)
         ) ELSE '{}' END,
         COALESCE(array_agg(g.queue) FILTER (WHERE g.key IS NOT NULL AND g.head), '{}'),
         COALESCE(array_agg(g.key) FILTER (WHERE g.key IS NOT NULL AND g.head), '{}')
  FROM gone AS g;
END
$$;
