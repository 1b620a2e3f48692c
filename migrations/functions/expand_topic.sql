-- expand_topic: its live definition, (re)applied by the migrator whenever this file changes (see
-- docs/contributing/migrations.md). Change the body here, never in a numbered migration.
--
-- A plain-SQL producer's row for a topic: `INSERT INTO outbox.messages (topic, payload[, key, headers,
-- available_at]) VALUES (…)`. It is expanded as fan_out expands an event (copy_to_queues: same locks, same
-- copies, same dead letter when no one subscribes) and not stored itself (the INSERT reports 0 rows). Named
-- to fire before the key-head trigger (BEFORE triggers run in name order), which then runs for each copy.
--
-- STABLE: its own queries then read with the INSERT statement's snapshot instead of a fresh one each, so
-- every row of one statement reaches the subscribers committed when the statement started (a volatile
-- trigger re-read them per row: a subscription committed halfway through a multi-row INSERT got some of
-- its rows and not others). The writing happens in copy_to_queues, a volatile function of its own.
-- A dedupe key is refused as publishToTopic refuses it: it would hold for no copy.
CREATE OR REPLACE FUNCTION {{schema}}.expand_topic() RETURNS trigger
LANGUAGE plpgsql STABLE AS $$
BEGIN
  IF NEW.queue IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = format(
      'outbox: a row names both queue %s and topic %s: set one (a topic reaches every queue subscribed to it)',
      left(quote_literal(NEW.queue), 60), left(quote_literal(NEW.topic), 60));
  END IF;
  IF NEW.dedupe_key IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = format(
      'outbox: a row for topic %s sets dedupe_key: a topic takes none (each subscriber''s copy is its own message); insert a row per queue with its own dedupe_key instead',
      left(quote_literal(NEW.topic), 60));
  END IF;
  PERFORM {{schema}}.copy_to_queues(NEW.topic, {{schema}}.topic_queues(NEW.topic), jsonb_build_array(
    jsonb_build_object('payload', NEW.payload, 'headers', NEW.headers, 'key', NEW.key,
                       'available_at', NEW.available_at)), true);
  RETURN NULL;
END
$$;
