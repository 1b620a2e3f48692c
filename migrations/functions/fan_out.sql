-- fan_out: its live definition, (re)applied by the migrator whenever this file changes (see
-- docs/contributing/migrations.md). Change the body here, never in a numbered migration.
--
-- One topic's events (items: a jsonb array of {payload, headers, key, available_at, delay_ms}), one message
-- per item per subscribed queue, in item order then queue order → (ord, id, queue); with no subscriber, a
-- dead letter `no_subscribers` per event (copy_to_queues, which writes them, says how).
--
-- SECURITY DEFINER, as its owner: a producer may call it (and so publish to any topic) without reading
-- subscriptions or inserting dead letters itself. search_path is pinned: nothing a caller creates is called.
-- The subscriptions are read once per call, all of its events go to the same queues: those committed when
-- its statement here started (READ COMMITTED; a volatile function's statement takes a fresh snapshot, so
-- for `SELECT … FROM fan_out(…)` that is a moment after the caller's statement started).
CREATE OR REPLACE FUNCTION {{schema}}.fan_out(topic text, items jsonb, keep_unrouted boolean DEFAULT true)
RETURNS TABLE (ord integer, id bigint, queue text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  RETURN QUERY
  SELECT f.ord, f.id, f.queue
  FROM {{schema}}.copy_to_queues(topic, {{schema}}.topic_queues(topic), items, keep_unrouted) AS f;
END
$$;
