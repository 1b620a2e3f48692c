-- route_unrouted: its live definition, (re)applied by the migrator whenever this file changes (see
-- docs/contributing/migrations.md). Change the body here, never in a numbered migration.
--
-- Replay of dead letters kept because their topic had no subscriber: each goes to the queues subscribed to
-- its topic now, or stays → (dead_id, id, queue) per copy. All keys' locks first, in (queue, key) order,
-- as every other writer takes them. SECURITY DEFINER like fan_out: the repairing inspector needs no right
-- on subscriptions.
CREATE OR REPLACE FUNCTION {{schema}}.route_unrouted(dead_ids bigint[])
RETURNS TABLE (dead_id bigint, id bigint, queue text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
  ids bigint[];
  topics text[];
  items jsonb[];
  copies integer;
BEGIN
  SELECT array_agg(p.id ORDER BY p.id), array_agg(p.headers ->> 'outbox-topic' ORDER BY p.id),
         array_agg(jsonb_build_object('payload', p.payload, 'headers', p.headers - 'outbox-topic',
                                      'key', p.key, 'available_at', now()) ORDER BY p.id)
  INTO ids, topics, items
  FROM (
    -- In id order, so two replays over the same rows cannot deadlock on them.
    SELECT x.* FROM {{schema}}.dead_letters AS x
    WHERE x.id = ANY(dead_ids) AND x.reason = 'no_subscribers' AND x.headers ? 'outbox-topic'
    ORDER BY x.id FOR UPDATE
  ) AS p;
  IF ids IS NULL THEN
    RETURN;
  END IF;
  PERFORM count(*) FROM (
    SELECT pg_advisory_xact_lock(hashtext(k.queue), hashtext(k.key)) FROM (
      SELECT DISTINCT q.queue, items[i] ->> 'key' AS key
      FROM generate_subscripts(ids, 1) AS i CROSS JOIN unnest({{schema}}.topic_queues(topics[i])) AS q(queue)
      WHERE items[i] ->> 'key' IS NOT NULL ORDER BY 1, 2
    ) AS k
  ) AS taken;
  FOR i IN 1 .. cardinality(ids) LOOP
    RETURN QUERY SELECT ids[i], f.id, f.queue FROM {{schema}}.fan_out(topics[i], jsonb_build_array(items[i]), false) AS f;
    GET DIAGNOSTICS copies = ROW_COUNT;
    IF copies > 0 THEN
      DELETE FROM {{schema}}.dead_letters AS x WHERE x.id = ids[i];
    END IF;
  END LOOP;
END
$$;
