-- expire_inbox: its live definition, (re)applied by the migrator whenever this file changes (see
-- docs/contributing/migrations.md). Change the body here, never in a numbered migration.
--
-- One batch of the inbox retention: at most `max_rows` records handled longer than `older_than_ms` ago,
-- oldest first, deleted → (queue, deleted). SKIP LOCKED: another worker's batch is never waited for. As the
-- owner (as expire_dead_letters): the worker's role needs neither DELETE nor UPDATE on the inbox.
CREATE OR REPLACE FUNCTION {{schema}}.expire_inbox(older_than_ms double precision, max_rows integer)
RETURNS TABLE (queue text, deleted integer)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
BEGIN
  RETURN QUERY
  WITH picked AS (
    SELECT x.consumer, x.dedupe_key FROM {{schema}}.inbox AS x
    WHERE x.handled_at < now() - older_than_ms * interval '1 millisecond'
    ORDER BY x.handled_at
    LIMIT max_rows
    FOR UPDATE SKIP LOCKED
  ), gone AS (
    DELETE FROM {{schema}}.inbox AS i USING picked AS p
    WHERE i.consumer = p.consumer AND i.dedupe_key = p.dedupe_key
    RETURNING i.queue
  )
  SELECT g.queue, count(*)::integer FROM gone AS g GROUP BY g.queue ORDER BY g.queue;
END
$$;
