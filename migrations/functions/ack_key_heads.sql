-- ack_key_heads: its live definition, (re)applied by the migrator whenever this file changes (see
-- docs/contributing/migrations.md). Change the body here, never in a numbered migration.
--
-- The keyed ack of ordered queues: acknowledge deliveries (id, token) of known queue and key (the worker has
-- both from the lease), then promote (and hand off) the next row of each key whose head went, in one call.
-- A head's key lock is only tried, on the arguments alone (one index look-up per delivery): waiting could
-- deadlock with a producer taking several keys' locks; a head whose lock is busy stays (kind 'busy').
-- Rows: 'deleted' (how many), 'written' per delivery deleted (only when some were not), 'busy', and
-- 'promoted' per new head (taken: handed off). The successor look-up starts above the deleted head
-- (promote_heads_after). Called by workers of the previous release too: keep its arguments and results.
-- The zero token fences rows no lease names: deliveries held by their leasing transaction's row lock
-- (leaseMode "transaction"); a lease's random token never equals it.
CREATE OR REPLACE FUNCTION {{schema}}.ack_key_heads(
  ids bigint[], tokens uuid[], queues text[], keys text[], hand_off integer, hand_token uuid,
  lease_ttl_ms double precision, worker_id text, wait_for_flush boolean
) RETURNS TABLE (
  kind text, delivery text, id text, queue text, payload text, headers jsonb, key text,
  created_epoch double precision, deliveries_count integer, attempts_count integer, failures_count integer,
  first_attempt_at timestamptz, last_attempt_at timestamptz, taken boolean
)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
  deleted integer;
  written bigint[];
  written_tokens uuid[];
  head_queues text[];
  head_keys text[];
  head_ids bigint[];
BEGIN
  IF NOT wait_for_flush THEN
    PERFORM set_config('synchronous_commit', 'off', true);
  END IF;
  WITH tried AS MATERIALIZED (
    -- Only tried, never waited for: waiting could deadlock with a producer taking several keys' locks.
    -- Materialised, so the lock is tried once per delivery and never on another row the plan reads.
    SELECT d.id, d.token, d.key IS NOT NULL AND pg_try_advisory_xact_lock(hashtext(d.queue), hashtext(d.key)) AS locked
    FROM unnest(ids, tokens, queues, keys) AS d(id, token, queue, key)
  ), gone AS (
    DELETE FROM {{schema}}.messages AS t USING tried AS k
    -- A head whose lock a producer holds stays (busy below).
    WHERE t.id = k.id AND COALESCE(t.acquired_token, '00000000-0000-0000-0000-000000000000'::uuid) = k.token AND (t.key IS NULL OR NOT t.head OR k.locked)
    RETURNING t.id, k.token, t.queue, t.key, t.head
  )
  -- Not yet as text: the deliveries written are named only when some were not.
  SELECT count(*), array_agg(g.id), array_agg(g.token),
         array_agg(g.queue) FILTER (WHERE g.key IS NOT NULL AND g.head),
         array_agg(g.key) FILTER (WHERE g.key IS NOT NULL AND g.head),
         array_agg(g.id) FILTER (WHERE g.key IS NOT NULL AND g.head)
  INTO deleted, written, written_tokens, head_queues, head_keys, head_ids
  FROM gone AS g;
  RETURN QUERY SELECT 'deleted', deleted::text, NULL::text, NULL::text, NULL::text, NULL::jsonb, NULL::text,
                      NULL::float8, NULL::int, NULL::int, NULL::int, NULL::timestamptz, NULL::timestamptz,
                      NULL::boolean;
  IF deleted < cardinality(ids) THEN
    RETURN QUERY SELECT 'written', w.id::text || '/' || w.token::text, NULL::text, NULL::text, NULL::text,
                        NULL::jsonb, NULL::text, NULL::float8, NULL::int, NULL::int, NULL::int,
                        NULL::timestamptz, NULL::timestamptz, NULL::boolean
                 FROM unnest(written, written_tokens) AS w(id, token);
    -- This statement sees the deletions above: what is still ours and heads a key was busy.
    RETURN QUERY SELECT 'busy', t.id::text || '/' || COALESCE(t.acquired_token, '00000000-0000-0000-0000-000000000000'::uuid)::text, NULL::text, NULL::text, NULL::text,
                        NULL::jsonb, NULL::text, NULL::float8, NULL::int, NULL::int, NULL::int,
                        NULL::timestamptz, NULL::timestamptz, NULL::boolean
                 FROM unnest(ids, tokens) AS b(id, token)
                 JOIN {{schema}}.messages AS t ON t.id = b.id AND COALESCE(t.acquired_token, '00000000-0000-0000-0000-000000000000'::uuid) = b.token
                 WHERE t.key IS NOT NULL AND t.head;
  END IF;
  IF head_keys IS NOT NULL THEN
    -- A statement of its own, so a fresh snapshot taken while the locks are held: it sees every row a
    -- producer of these keys committed.
    RETURN QUERY SELECT 'promoted', NULL::text, p.*
                 FROM {{schema}}.promote_heads_after(head_queues, head_keys, head_ids, hand_off, hand_token, lease_ttl_ms, worker_id) AS p;
  END IF;
END
$$;
