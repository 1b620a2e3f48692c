-- ack_keyed: its live definition, (re)applied by the migrator whenever this file changes (see
-- docs/contributing/migrations.md). Change the body here, never in a numbered migration.
--
-- The keyed ack of queues that opt out of ordering (their rows may or may not head a key): as ack_key_heads,
-- but each delivery's queue and key are read from its row. The lock is tried on the deliveries' own rows
-- only (materialised first): a filter on the table would run on every leased row the planner scans and
-- hold the locks of other workers' keys until commit. Promotion looks from the start of each key.
-- The zero token fences rows no lease names: deliveries held by their leasing transaction's row lock
-- (leaseMode "transaction"); a lease's random token never equals it.
CREATE OR REPLACE FUNCTION {{schema}}.ack_keyed(
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
  WITH mine AS MATERIALIZED (
    SELECT t.id, d.token, t.queue, t.key, t.head
    FROM unnest(ids, tokens) AS d(id, token) JOIN {{schema}}.messages AS t ON t.id = d.id AND COALESCE(t.acquired_token, '00000000-0000-0000-0000-000000000000'::uuid) = d.token
  ), kept AS MATERIALIZED (
    -- The lock is tried on the deliveries' own rows only (materialised first): a filter on the table would
    -- run on every leased row the planner scans and hold the locks of other workers' keys until commit.
    SELECT k.id, k.token, k.key IS NOT NULL AND k.head AS locked FROM mine AS k
    WHERE k.key IS NULL OR NOT k.head OR pg_try_advisory_xact_lock(hashtext(k.queue), hashtext(k.key))
  ), gone AS (
    DELETE FROM {{schema}}.messages AS t USING kept AS k
    -- A row promoted since `mine` read it (an unordered queue's) is a head without its lock: busy.
    WHERE t.id = k.id AND COALESCE(t.acquired_token, '00000000-0000-0000-0000-000000000000'::uuid) = k.token AND (t.key IS NULL OR NOT t.head OR k.locked)
    RETURNING t.id::text || '/' || k.token::text AS delivery, t.queue, t.key, t.head
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
    RETURN QUERY SELECT 'busy', t.id::text || '/' || COALESCE(t.acquired_token, '00000000-0000-0000-0000-000000000000'::uuid)::text, NULL::text, NULL::text, NULL::text,
                        NULL::jsonb, NULL::text, NULL::float8, NULL::int, NULL::int, NULL::int,
                        NULL::timestamptz, NULL::timestamptz, NULL::boolean
                 FROM unnest(ids, tokens) AS b(id, token)
                 JOIN {{schema}}.messages AS t ON t.id = b.id AND COALESCE(t.acquired_token, '00000000-0000-0000-0000-000000000000'::uuid) = b.token
                 WHERE t.key IS NOT NULL AND t.head;
  END IF;
  IF head_keys IS NOT NULL THEN
    RETURN QUERY SELECT 'promoted', NULL::text, p.*
                 FROM {{schema}}.promote_heads(head_queues, head_keys, hand_off, hand_token, lease_ttl_ms, worker_id) AS p;
  END IF;
END
$$;
