-- expire_dead_letters: its live definition, (re)applied by the migrator whenever this file changes (see
-- docs/contributing/migrations.md). Change the body here, never in a numbered migration.
--
-- One batch of the dead-letter retention: at most `max_rows` dead letters older than `older_than_ms`,
-- oldest first, deleted → (queue, deleted). SKIP LOCKED: a row a replay, a purge or another replica holds
-- is left for a later run. As the owner: the worker needs neither DELETE nor UPDATE on dead_letters.
CREATE OR REPLACE FUNCTION {{schema}}.expire_dead_letters(older_than_ms double precision, max_rows integer)
RETURNS TABLE (queue text, deleted integer)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
BEGIN
  RETURN QUERY
  WITH picked AS (
    SELECT x.id FROM {{schema}}.dead_letters AS x
    WHERE x.dead_at < now() - older_than_ms * interval '1 millisecond'
    ORDER BY x.dead_at
    LIMIT max_rows
    FOR UPDATE SKIP LOCKED
  ), gone AS (
    DELETE FROM {{schema}}.dead_letters AS d USING picked AS p WHERE d.id = p.id
    RETURNING d.queue
  )
  SELECT g.queue, count(*)::integer FROM gone AS g GROUP BY g.queue ORDER BY g.queue;
END
$$;
