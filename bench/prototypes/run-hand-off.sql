CREATE OR REPLACE FUNCTION {{schema}}.promote_runs(
  queues text[], keys text[], hand_token uuid, lease_ttl_ms double precision, worker_id text, run_len integer
) RETURNS TABLE (id text, key text, taken boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
  RETURN QUERY
  WITH next AS (
    SELECT n.id, n.pos, n.ok FROM unnest(queues, keys) AS k(queue, key)
    CROSS JOIN LATERAL (
      SELECT x.id, row_number() OVER (ORDER BY x.id) AS pos,
             bool_and(x.acquired_token IS NULL AND x.available_at <= now()) OVER (ORDER BY x.id) AS ok
      FROM (SELECT m.id, m.acquired_token, m.available_at FROM {{schema}}.messages AS m
            WHERE m.queue = k.queue AND m.key = k.key ORDER BY m.id LIMIT run_len) AS x
    ) AS n
  )
  UPDATE {{schema}}.messages AS t
  SET head = t.head OR r.pos = 1,
      acquired_token = hand_token, acquired_at = now(),
      lease_expires_at = now() + lease_ttl_ms * interval '1 millisecond',
      acquired_by = worker_id, deliveries_count = t.deliveries_count + 1
  FROM next AS r
  WHERE t.id = r.id AND r.ok AND t.acquired_token IS NULL
  RETURNING t.id::text, t.key, true;
END
$$;

CREATE OR REPLACE FUNCTION {{schema}}.ack_runs(
  ids bigint[], tokens uuid[], queues text[], keys text[], last boolean[], hand_token uuid,
  lease_ttl_ms double precision, worker_id text, run_len integer
) RETURNS TABLE (id text, key text, taken boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
  head_queues text[];
  head_keys text[];
BEGIN
  PERFORM set_config('synchronous_commit', 'off', true);
  WITH tried AS MATERIALIZED (
    SELECT d.id, d.token, d.last, d.key IS NOT NULL AND d.last AND pg_try_advisory_xact_lock(hashtext(d.queue), hashtext(d.key)) AS locked
    FROM unnest(ids, tokens, queues, keys, last) AS d(id, token, queue, key, last)
  ), gone AS (
    DELETE FROM {{schema}}.messages AS t USING tried AS k
    WHERE t.id = k.id AND t.acquired_token = k.token AND (t.key IS NULL OR NOT k.last OR k.locked)
    RETURNING t.queue, t.key, k.last
  )
  SELECT array_agg(g.queue) FILTER (WHERE g.key IS NOT NULL AND g.last),
         array_agg(g.key) FILTER (WHERE g.key IS NOT NULL AND g.last)
  INTO head_queues, head_keys FROM gone AS g;
  IF head_keys IS NOT NULL THEN
    RETURN QUERY SELECT * FROM {{schema}}.promote_runs(head_queues, head_keys, hand_token, lease_ttl_ms, worker_id, run_len);
  END IF;
END
$$;
