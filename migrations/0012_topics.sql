-- Topics and subscriptions: one event, one message per subscribed queue, written in the producer's own
-- transaction. Subscriptions are data: a producer names a topic, never its consumers. Both producer paths
-- meet in fan_out(): `publishToTopic` calls it, and a plain-SQL INSERT with `topic` set goes through the
-- trigger below, which calls it and stores nothing itself.
--
-- Names are dot-separated segments (`order.placed`). A pattern is a name whose segments may also be `*`
-- (exactly one segment) or `#` (zero or more): RabbitMQ's topic-exchange syntax, the one most operators
-- already know. `order.*` receives order.placed but not order.placed.eu; `order.#` receives both, and order.

-- The regular expression that `'.' || topic` must match for a pattern; raises for a malformed pattern (a
-- CHECK through it names the problem). Segment characters are never special in a regular expression.
CREATE FUNCTION {{schema}}.topic_matcher(pattern text) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT AS $$
DECLARE
  segment text;
  matcher text := '';
BEGIN
  IF octet_length(pattern) > 200 OR pattern !~ '^([*#]|[A-Za-z0-9_:/-]+)(\.([*#]|[A-Za-z0-9_:/-]+))*$' THEN
    RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = format(
      'outbox: %s is not a topic pattern: dot-separated segments of letters, digits and _ : / -, or * (one segment) or # (any number), at most 200 bytes',
      left(quote_literal(pattern), 60));
  END IF;
  FOREACH segment IN ARRAY string_to_array(pattern, '.') LOOP
    matcher := matcher || CASE segment WHEN '*' THEN '\.[^.]+' WHEN '#' THEN '(\.[^.]+)*' ELSE '\.' || segment END;
  END LOOP;
  RETURN '^' || matcher || '$';
END
$$;

CREATE TABLE {{schema}}.subscriptions (
  pattern    text        NOT NULL,
  queue      text        NOT NULL CHECK (queue ~ '^[A-Za-z0-9][A-Za-z0-9._:/-]*$' AND octet_length(queue) <= 200),
  created_at timestamptz NOT NULL DEFAULT now(),
  -- Exact names are found by equality; only wildcard patterns run their expression.
  wildcard   boolean     GENERATED ALWAYS AS (pattern ~ '(^|\.)[*#](\.|$)') STORED,
  matcher    text        GENERATED ALWAYS AS ({{schema}}.topic_matcher(pattern)) STORED,
  PRIMARY KEY (pattern, queue)
);
CREATE INDEX subscriptions_queue_idx ON {{schema}}.subscriptions (queue);

-- What a plain-SQL producer sets instead of `queue`. Always null in a stored row: such a row is expanded.
-- Quick on a live table (nullable, no default: a catalog change); given up on after a moment, as in 0003.
SET LOCAL lock_timeout = '250ms';
ALTER TABLE {{schema}}.messages ADD COLUMN topic text NULL;

-- The queues that receive `topic`, in name order (each once, however many of its patterns match).
-- SECURITY DEFINER: a producer's trailing wake-up asks it which queues to wake, without reading subscriptions.
CREATE FUNCTION {{schema}}.topic_queues(topic text) RETURNS text[]
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
  SELECT coalesce(array_agg(DISTINCT s.queue ORDER BY s.queue), '{}')
  FROM {{schema}}.subscriptions AS s
  WHERE s.pattern = topic OR (s.wildcard AND '.' || topic ~ s.matcher)
$$;

-- One topic's events (items: a jsonb array of {payload, headers, key, available_at, delay_ms}), one message
-- per item per subscribed queue, in item order then queue order → (ord, id, queue). The topic travels in
-- the header `outbox-topic`. With no subscriber, each event is kept as a dead letter `no_subscribers`
-- (queue = the topic): nothing published is lost, and replay fans it out to whoever subscribes by then.
-- keep_unrouted false (replay): nothing is written, no row returned.
--
-- SECURITY DEFINER, as its owner: a producer may call it (and so publish to any topic) without reading
-- subscriptions or inserting dead letters itself. search_path is pinned: nothing a caller creates is called.
-- The subscriptions read are those committed when this statement started (READ COMMITTED): a subscription
-- receives events published after it committed.
CREATE FUNCTION {{schema}}.fan_out(topic text, items jsonb, keep_unrouted boolean DEFAULT true)
RETURNS TABLE (ord integer, id bigint, queue text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
  queues text[];
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
  queues := {{schema}}.topic_queues(topic);
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
  PERFORM count(*) FROM (
    SELECT pg_advisory_xact_lock(hashtext(k.queue), hashtext(k.key)) FROM (
      SELECT DISTINCT q.queue, i.item ->> 'key' AS key
      FROM unnest(queues) AS q(queue) CROSS JOIN jsonb_array_elements(items) AS i(item)
      WHERE i.item ->> 'key' IS NOT NULL ORDER BY 1, 2
    ) AS k
  ) AS taken;
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

-- A plain-SQL producer's row for a topic: `INSERT INTO outbox.messages (topic, payload[, key, headers,
-- available_at]) VALUES (…)`. It is expanded by fan_out (same locks, same copies, same dead letter when no
-- one subscribes) and not stored itself (the INSERT reports 0 rows). Named to fire before the key-head
-- trigger (BEFORE triggers run in name order), which then runs for each copy.
CREATE FUNCTION {{schema}}.expand_topic() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.queue IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = format(
      'outbox: a row names both queue %s and topic %s: set one (a topic reaches every queue subscribed to it)',
      left(quote_literal(NEW.queue), 60), left(quote_literal(NEW.topic), 60));
  END IF;
  PERFORM {{schema}}.fan_out(NEW.topic, jsonb_build_array(jsonb_build_object(
    'payload', NEW.payload, 'headers', NEW.headers, 'key', NEW.key, 'available_at', NEW.available_at)));
  RETURN NULL;
END
$$;

CREATE TRIGGER messages_expand_topic BEFORE INSERT ON {{schema}}.messages
  FOR EACH ROW WHEN (NEW.topic IS NOT NULL) EXECUTE FUNCTION {{schema}}.expand_topic();

-- Replay of dead letters kept because their topic had no subscriber: each goes to the queues subscribed to
-- its topic now, or stays → (dead_id, id, queue) per copy. All keys' locks first, in (queue, key) order,
-- as every other writer takes them. SECURITY DEFINER like fan_out: the repairing inspector needs no right
-- on subscriptions.
CREATE FUNCTION {{schema}}.route_unrouted(dead_ids bigint[])
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

-- On a schema whose rights `outbox-worker grant` set (it takes PUBLIC's EXECUTE from every function here),
-- the new functions start the same way: fan_out, topic_queues and route_unrouted run as their owner, and
-- with Postgres' default EXECUTE for PUBLIC any role that reaches the schema (a worker, an inspector) could
-- publish to any topic or replay kept events until `grant` runs again. Nobody but the owner calls them
-- until then. A schema never granted keeps the defaults, as 0006 and 0009 do.
DO $$
BEGIN
  IF (SELECT proacl FROM pg_proc
      WHERE oid = '{{schema}}.ack_keyed(bigint[], uuid[], integer, uuid, double precision, text, boolean)'::regprocedure)
     IS NOT NULL THEN
    REVOKE ALL ON FUNCTION {{schema}}.fan_out(text, jsonb, boolean), {{schema}}.topic_queues(text),
      {{schema}}.route_unrouted(bigint[]), {{schema}}.topic_matcher(text), {{schema}}.expand_topic() FROM PUBLIC;
  END IF;
END
$$;
