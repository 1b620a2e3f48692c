-- dead_letter_announced: its live definition, (re)applied by the migrator whenever this file changes (see
-- docs/contributing/migrations.md). Change the body here, never in a numbered migration.
--
-- Failure announcements (issue 29): a queue configured with `announceFailures` has each dead-letter move
-- also publish a failure event to a queue or topic the user names, in the SAME statement as the move, so
-- the event exists if and only if the dead letter does (a crash commits both or neither).
--
-- dead_letter_announced() is dead_letter() (still what the worker calls for queues without the option:
-- they pay nothing) followed, in the same function call, by the events of the
-- deliveries it actually moved: token-fenced and not left busy, read back from the dead letters it just
-- wrote. `announce_queues[i]` / `announce_topics[i]` name delivery i's target (at most one; both null: no
-- event). The event is keyless: the move never waits for a producer's key lock on the target (a wait there
-- could deadlock with a producer of that key); its payload names the original key. A topic target fans out
-- through fan_out() as publishToTopic does (no subscriber: kept as a `no_subscribers` dead letter). Each
-- queue that got an event is woken on `channel` (null: no notification), at commit, as publish does.
-- SECURITY DEFINER with search_path pinned, as dead_letter(): the worker's role chooses where failures are
-- announced, never what the event says (it is built from the dead letter's own columns).
CREATE OR REPLACE FUNCTION {{schema}}.dead_letter_announced(
  ids bigint[], tokens uuid[], reasons text[], errors text[], attempted_flags integer[],
  failed_flags integer[], max_error_length integer, wait_for_flush boolean,
  announce_queues text[], announce_topics text[], channel text
) RETURNS TABLE (keys text[], busy text[], head_queues text[], head_keys text[])
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
  r record;
  woken text[];
BEGIN
  SELECT * INTO STRICT r FROM {{schema}}.dead_letter(ids, tokens, reasons, errors, attempted_flags,
    failed_flags, max_error_length, wait_for_flush) AS d;
  -- The deliveries moved: every one when `keys` is null, else those it names (a lost lease or a busy head
  -- moved nothing, so announces nothing). Their dead letters are the previous statement's writes.
  WITH ev AS MATERIALIZED (
    SELECT a.queue AS target_queue, CASE WHEN a.queue IS NULL THEN a.topic END AS target_topic, dl.id,
           jsonb_build_object('id', dl.id::text, 'queue', dl.queue, 'reason', dl.reason, 'error', dl.error,
             'attempts', dl.attempts_count, 'deliveries', dl.deliveries_count, 'key', dl.key,
             'headers', dl.headers, 'failedAt', dl.dead_at)
           || CASE WHEN dl.headers ? 'outbox-topic'
                   THEN jsonb_build_object('topic', dl.headers ->> 'outbox-topic') ELSE '{}' END AS payload,
           -- The original trace travels on; the header names the event a failure of message `id`.
           jsonb_strip_nulls(jsonb_build_object('outbox-failure-of', dl.id::text,
             'traceparent', dl.headers ->> 'traceparent', 'tracestate', dl.headers ->> 'tracestate')) AS headers
    FROM unnest(ids, tokens, announce_queues, announce_topics) AS a(id, token, queue, topic)
    JOIN {{schema}}.dead_letters AS dl ON dl.id = a.id
    WHERE (a.queue IS NOT NULL OR a.topic IS NOT NULL)
      AND (r.keys IS NULL OR a.id::text || '/' || a.token::text = ANY (r.keys))
  ), ins AS (
    INSERT INTO {{schema}}.messages (queue, payload, headers, key)
    SELECT e.target_queue, e.payload, e.headers, NULL FROM ev AS e
    WHERE e.target_queue IS NOT NULL ORDER BY e.id
    RETURNING queue
  ), fanned AS MATERIALIZED (
    SELECT f.queue FROM (
      SELECT e.target_topic AS topic,
             jsonb_agg(jsonb_build_object('payload', e.payload, 'headers', e.headers) ORDER BY e.id) AS items
      FROM ev AS e WHERE e.target_topic IS NOT NULL GROUP BY e.target_topic ORDER BY 1
    ) AS g CROSS JOIN LATERAL {{schema}}.fan_out(g.topic, g.items) AS f
  )
  -- Aggregated over both, so the fan-out runs whether or not anyone is woken.
  SELECT array_agg(DISTINCT w.queue) INTO woken
  FROM (SELECT i.queue FROM ins AS i UNION ALL SELECT x.queue FROM fanned AS x) AS w;
  IF channel IS NOT NULL AND woken IS NOT NULL THEN
    PERFORM pg_notify(channel, q.queue) FROM unnest(woken) AS q(queue);
  END IF;
  RETURN QUERY SELECT r.keys, r.busy, r.head_queues, r.head_keys;
END
$$;
