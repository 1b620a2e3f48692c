-- The promotion's successor look-up starts above the deleted head (0007 says why), for the keyed ack that
-- knows its heads' ids: ack_key_heads, replaced in place (same arguments and rights: a worker of the previous
-- version calls it too). promote_heads, which ack_keyed and the dead-letter move call, looks from the start of
-- the key, as before, through the same function.

-- Rows already below a head of their key when 0007 came in (a dead letter replayed before, or a head left
-- leased by 0004's backfill): marked as the trigger now marks them. 0007's table lock waited out every
-- producer of the earlier trigger, so every such row is committed and seen here. Row locks only.
UPDATE {{schema}}.messages AS m SET below_head = true
WHERE m.key IS NOT NULL AND NOT m.below_head
  AND EXISTS (
    SELECT 1 FROM {{schema}}.messages AS h WHERE h.queue = m.queue AND h.key = m.key AND h.head AND h.id > m.id
  );

-- promote_heads of 0003, with each key's look-up bounded below by `afters` (the deleted heads' ids; 0: from
-- the start of the key).
CREATE FUNCTION {{schema}}.promote_heads_after(
  queues text[], keys text[], afters bigint[], hand_off integer, hand_token uuid, lease_ttl_ms double precision, worker_id text
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
    SELECT n.id, n.available_at <= now() AS due FROM unnest(queues, keys, afters) AS k(queue, key, after)
    CROSS JOIN LATERAL (
      SELECT m.id, m.available_at FROM {{schema}}.messages AS m
      WHERE m.queue = k.queue AND m.key = k.key
        -- Above the deleted head, or from the key's lowest row marked below_head: those can sit below the
        -- head they waited behind. Whether any row is marked at all is one probe per call, of an index
        -- that is nearly always empty; only then is each key probed.
        AND m.id > CASE WHEN EXISTS (SELECT 1 FROM {{schema}}.messages AS a WHERE a.below_head)
                        THEN LEAST(k.after, (
                          SELECT min(b.id) - 1 FROM {{schema}}.messages AS b
                          WHERE b.queue = k.queue AND b.key = k.key AND b.below_head
                        ))
                        ELSE k.after END
      ORDER BY m.id LIMIT 1
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

CREATE OR REPLACE FUNCTION {{schema}}.promote_heads(
  queues text[], keys text[], hand_off integer, hand_token uuid, lease_ttl_ms double precision, worker_id text
) RETURNS TABLE (
  id text, queue text, payload text, headers jsonb, key text, created_epoch double precision,
  deliveries_count integer, attempts_count integer, failures_count integer,
  first_attempt_at timestamptz, last_attempt_at timestamptz, taken boolean
)
LANGUAGE sql AS $$
  SELECT * FROM {{schema}}.promote_heads_after(
    queues, keys, array_fill(0::bigint, ARRAY[cardinality(keys)]), hand_off, hand_token, lease_ttl_ms, worker_id
  )
$$;

-- Whoever may call promote_heads may call promote_heads_after, and nobody else (as in 0006).
DO $$
DECLARE
  old_acl aclitem[];
  fn regprocedure := '{{schema}}.promote_heads_after(text[], text[], bigint[], integer, uuid, double precision, text)';
  role_oid oid;
BEGIN
  SELECT proacl INTO old_acl FROM pg_proc
  WHERE oid = '{{schema}}.promote_heads(text[], text[], integer, uuid, double precision, text)'::regprocedure;
  -- Null: default privileges, which the new function has too.
  IF old_acl IS NULL THEN
    RETURN;
  END IF;
  EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', fn);
  FOR role_oid IN SELECT a.grantee FROM aclexplode(old_acl) AS a WHERE a.privilege_type = 'EXECUTE' LOOP
    EXECUTE format(
      'GRANT EXECUTE ON FUNCTION %s TO %s', fn, CASE WHEN role_oid = 0 THEN 'PUBLIC' ELSE role_oid::regrole::text END
    );
  END LOOP;
END
$$;

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
    WHERE t.id = k.id AND t.acquired_token = k.token AND (t.key IS NULL OR NOT t.head OR k.locked)
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
    RETURN QUERY SELECT 'busy', t.id::text || '/' || t.acquired_token::text, NULL::text, NULL::text, NULL::text,
                        NULL::jsonb, NULL::text, NULL::float8, NULL::int, NULL::int, NULL::int,
                        NULL::timestamptz, NULL::timestamptz, NULL::boolean
                 FROM unnest(ids, tokens) AS b(id, token)
                 JOIN {{schema}}.messages AS t ON t.id = b.id AND t.acquired_token = b.token
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
