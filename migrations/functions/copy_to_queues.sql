-- copy_to_queues: its live definition, (re)applied by the migrator whenever this file changes (see
-- docs/contributing/migrations.md). Change the body here, never in a numbered migration.
--
-- fan_out's writing half, for subscribed queues already read: one topic's events (items: a jsonb array of
-- {payload, headers, key, available_at, delay_ms}), one message per item per queue of `queues` (the
-- subscribers, in name order, as topic_queues gives them), in item order then queue order → (ord, id, queue).
-- The topic travels in the header `outbox-topic`. With no queue, each event is kept as a dead letter
-- `no_subscribers` (queue = the topic): nothing published is lost, and replay fans it out to whoever
-- subscribes by then. keep_unrouted false (replay): nothing is written, no row returned.
--
-- Apart from fan_out so that the plain-SQL trigger (expand_topic) can pass the queues it read with its INSERT
-- statement's own snapshot: every row of one statement reaches the same subscribers. Named to sort before
-- its callers, so the migrator creates it before their bodies that call it.
-- SECURITY DEFINER, as its owner: a producer's trigger calls it without rights on dead_letters. Callable by
-- whoever may call fan_out; the queues are the caller's word, but a producer may insert into any queue
-- anyway, and with none it writes only the dead letter publishing to a topic nobody subscribes to writes.
-- search_path is pinned: nothing a caller creates is called. Generic plans (plan_cache_mode): with the queue
-- array a parameter, a custom plan for 1 or 3 queues looks cheaper than the generic one, so the plan cache
-- kept re-planning the INSERT and the lock statement (bench/RESULTS.md, issue 27).
-- outbox:grant-as fan_out(text, jsonb, boolean)
CREATE OR REPLACE FUNCTION {{schema}}.copy_to_queues(topic text, queues text[], items jsonb, keep_unrouted boolean)
RETURNS TABLE (ord integer, id bigint, queue text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp SET plan_cache_mode = force_generic_plan AS $$
#variable_conflict use_column
DECLARE
  n integer;
BEGIN
  IF topic IS NULL OR octet_length(topic) > 200 OR topic !~ '^[A-Za-z0-9_:/-]+(\.[A-Za-z0-9_:/-]+)*$' THEN
    RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = format(
      'outbox: %s is not a topic name: dot-separated segments of letters, digits and _ : / -, at most 200 bytes',
      coalesce(left(quote_literal(topic), 60), 'null'));
  END IF;
  IF items IS NULL OR jsonb_typeof(items) <> 'array' THEN
    RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'outbox: fan_out items must be a JSON array';
  END IF;
  IF queues IS NULL OR array_position(queues, NULL) IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'outbox: copy_to_queues queues must be an array of queue names';
  END IF;
  n := cardinality(queues);
  IF n = 0 THEN
    IF keep_unrouted THEN
      INSERT INTO {{schema}}.dead_letters
        (id, queue, payload, headers, key, created_at, available_at, deliveries_count, attempts_count,
         failures_count, reason, error)
      SELECT nextval(pg_get_serial_sequence('{{schema}}.messages', 'id')), topic, e.item -> 'payload',
             coalesce(e.item -> 'headers', '{}') || jsonb_build_object('outbox-topic', topic),
             e.item ->> 'key', now(),
             coalesce((e.item ->> 'available_at')::timestamptz,
                      now() + coalesce((e.item ->> 'delay_ms')::double precision, 0) * interval '1 millisecond'),
             0, 0, 0, 'no_subscribers', format('no queue subscribes to topic %s', topic)
      FROM jsonb_array_elements(items) WITH ORDINALITY AS e(item, o)
      ORDER BY e.o;
    END IF;
    RETURN;
  END IF;
  -- Every (queue, key) lock before any id, in (queue, key) order as publish, publishMany and replay take
  -- them: ids then follow commit order within each subscriber's key, and two producers cannot deadlock.
  -- Skipped when no event has a key (nothing to order).
  IF jsonb_path_exists(items, '$[*].key ? (@ != null)') THEN
    PERFORM count(*) FROM (
      SELECT pg_advisory_xact_lock(hashtext(k.queue), hashtext(k.key)) FROM (
        SELECT DISTINCT q.queue, i.item ->> 'key' AS key
        FROM unnest(queues) AS q(queue) CROSS JOIN jsonb_array_elements(items) AS i(item)
        WHERE i.item ->> 'key' IS NOT NULL ORDER BY 1, 2
      ) AS k
    ) AS taken;
  END IF;
  -- Ids are drawn in the SELECT's order (item, then queue): the n-th id is item (n-1)/queues + 1.
  RETURN QUERY
  WITH ins AS (
    INSERT INTO {{schema}}.messages AS m (queue, payload, headers, key, available_at)
    SELECT q.queue, e.item -> 'payload',
           coalesce(e.item -> 'headers', '{}') || jsonb_build_object('outbox-topic', topic),
           e.item ->> 'key',
           coalesce((e.item ->> 'available_at')::timestamptz,
                    now() + coalesce((e.item ->> 'delay_ms')::double precision, 0) * interval '1 millisecond')
    FROM jsonb_array_elements(items) WITH ORDINALITY AS e(item, o)
    CROSS JOIN unnest(queues) WITH ORDINALITY AS q(queue, qo)
    ORDER BY e.o, q.qo
    RETURNING m.id, m.queue
  )
  SELECT ((row_number() OVER (ORDER BY ins.id) - 1) / n + 1)::integer, ins.id, ins.queue
  FROM ins ORDER BY ins.id;
END
$$;
