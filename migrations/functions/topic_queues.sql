-- topic_queues: its live definition, (re)applied by the migrator whenever this file changes (see
-- docs/contributing/migrations.md). Change the body here, never in a numbered migration.
--
-- The queues that receive `topic`, in name order (each once, however many of its patterns match).
-- SECURITY DEFINER: a producer's trailing wake-up asks it which queues to wake, without reading
-- subscriptions. plpgsql, not LANGUAGE sql: Postgres before 18 plans a sql function's query on every call;
-- plpgsql keeps its plan for the session.
CREATE OR REPLACE FUNCTION {{schema}}.topic_queues(topic text) RETURNS text[]
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  RETURN (
    SELECT coalesce(array_agg(DISTINCT s.queue ORDER BY s.queue), '{}')
    FROM {{schema}}.subscriptions AS s
    WHERE s.pattern = topic OR (s.wildcard AND '.' || topic ~ s.matcher)
  );
END
$$;
