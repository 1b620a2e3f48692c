-- promote_heads_after: its live definition, (re)applied by the migrator whenever this file changes (see
-- docs/contributing/migrations.md). Change the body here, never in a numbered migration.
--
-- promote_heads, with each key's look-up bounded below by `afters` (the deleted heads' ids; 0: from the start
-- of the key): the index entries of the key's deleted rows are skipped. The hand-off's delivery count
-- saturates instead of overflowing.
CREATE OR REPLACE FUNCTION {{schema}}.promote_heads_after(
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
      -- Saturated: a count at its limit must not fail the whole ack (the worker dead-letters such a row).
      deliveries_count = LEAST(t.deliveries_count, 2147483646)
                         + CASE WHEN r.take AND t.acquired_token IS NULL THEN 1 ELSE 0 END
  FROM ranked AS r
  WHERE t.id = r.id AND (NOT t.head OR (r.take AND t.acquired_token IS NULL))
  RETURNING t.id::text, t.queue, t.payload::text, t.headers, t.key, date_part('epoch', t.created_at),
            t.deliveries_count, t.attempts_count, t.failures_count, t.first_attempt_at, t.last_attempt_at,
            t.acquired_token IS NOT DISTINCT FROM hand_token;
END
$$;
