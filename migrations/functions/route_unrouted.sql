-- route_unrouted: its live definition, (re)applied by the migrator whenever this file changes (see
-- docs/contributing/migrations.md). Change the body here, never in a numbered migration.
--
-- Replay of dead letters kept because their topic had no subscriber: each goes to the queues subscribed to
-- its topic now, or stays → (dead_id, id, queue) per copy. SECURITY DEFINER like fan_out: the repairing
-- inspector needs no right on subscriptions.
--
-- Key locks are tried, never waited for (as replay's): a plain-SQL producer's multi-row INSERT takes its
-- keys' locks in its own row order, so waiting in any order could close a cycle with it. An event one of
-- whose (queue, key) locks is busy stays a dead letter, for the caller's next try in a new transaction;
-- its copies go in with the very queues whose locks were tried (read once), so the key-head trigger only
-- takes locks this transaction holds already. The copies are fan_out's (the topic header put back).
CREATE OR REPLACE FUNCTION {{schema}}.route_unrouted(dead_ids bigint[])
RETURNS TABLE (dead_id bigint, id bigint, queue text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
  ids bigint[];
  topics text[];
  items jsonb[];
  queues text[];
  event_key text;
  copies integer;
BEGIN
  SELECT array_agg(p.id ORDER BY p.id), array_agg(p.headers ->> 'outbox-topic' ORDER BY p.id),
         array_agg(jsonb_build_object('payload', p.payload, 'headers', p.headers, 'key', p.key) ORDER BY p.id)
  INTO ids, topics, items
  FROM (
    -- In id order, so two replays over the same rows cannot deadlock on them; all before any key lock.
    SELECT x.* FROM {{schema}}.dead_letters AS x
    WHERE x.id = ANY(dead_ids) AND x.reason = 'no_subscribers' AND x.headers ? 'outbox-topic'
    ORDER BY x.id FOR UPDATE
  ) AS p;
  IF ids IS NULL THEN
    RETURN;
  END IF;
  FOR i IN 1 .. cardinality(ids) LOOP
    queues := {{schema}}.topic_queues(topics[i]);
    event_key := items[i] ->> 'key';
    CONTINUE WHEN cardinality(queues) = 0;
    CONTINUE WHEN event_key IS NOT NULL AND EXISTS (
      SELECT 1 FROM unnest(queues) AS q(queue)
      WHERE NOT pg_try_advisory_xact_lock(hashtext(q.queue), hashtext(event_key))
    );
    RETURN QUERY
    WITH ins AS (
      INSERT INTO {{schema}}.messages AS m (queue, payload, headers, key, available_at)
      SELECT q.queue, items[i] -> 'payload', items[i] -> 'headers', event_key, now()
      FROM unnest(queues) WITH ORDINALITY AS q(queue, qo)
      ORDER BY q.qo
      RETURNING m.id, m.queue
    )
    SELECT ids[i], ins.id, ins.queue FROM ins ORDER BY ins.id;
    GET DIAGNOSTICS copies = ROW_COUNT;
    IF copies > 0 THEN
      DELETE FROM {{schema}}.dead_letters AS x WHERE x.id = ids[i];
    END IF;
  END LOOP;
END
$$;
