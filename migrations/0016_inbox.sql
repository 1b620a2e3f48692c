-- The worker inbox (issue 29): one record per (consumer, dedupe key) whose handler succeeded, written in its
-- own statement BEFORE the message's ack. A redelivery (the ack's answer lost, a lease that ran out) finds it
-- and is acked without running the handler again. Only queues configured with `inbox` read or write it.
-- Records older than the worker's inboxRetentionMs are deleted in batches through expire_inbox().
CREATE TABLE {{schema}}.inbox (
  consumer   text        NOT NULL,
  dedupe_key text        NOT NULL,
  handled_at timestamptz NOT NULL DEFAULT now(),
  -- The message whose handler wrote it (for a person asking why a later one was deduped).
  message_id bigint      NOT NULL,
  queue      text        NOT NULL,
  PRIMARY KEY (consumer, dedupe_key)
);

-- The retention's batches take the oldest records first: an index scan, never a scan of the table.
CREATE INDEX inbox_handled_at_idx ON {{schema}}.inbox (handled_at);

-- One batch of the inbox retention: at most `max_rows` records handled longer than `older_than_ms` ago,
-- oldest first, deleted → (queue, deleted). SKIP LOCKED: another worker's batch is never waited for. As the
-- owner (as expire_dead_letters): the worker's role needs neither DELETE nor UPDATE on the inbox.
CREATE FUNCTION {{schema}}.expire_inbox(older_than_ms double precision, max_rows integer)
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

-- Until `grant` runs again, roles keep working: the inbox goes to roles that may ack (DELETE on messages)
-- and its reading to roles that may read dead letters (inspectors). Nobody else may run expire_inbox.
DO $$
DECLARE
  r regrole;
BEGIN
  REVOKE ALL ON FUNCTION {{schema}}.expire_inbox(double precision, integer) FROM PUBLIC;
  FOR r IN
    SELECT a.grantee::regrole FROM pg_class AS c, aclexplode(c.relacl) AS a
    WHERE c.oid = '{{schema}}.messages'::regclass AND a.privilege_type = 'DELETE' AND a.grantee <> 0
  LOOP
    EXECUTE format('GRANT SELECT, INSERT ON {{schema}}.inbox TO %s', r);
    EXECUTE format('GRANT EXECUTE ON FUNCTION {{schema}}.expire_inbox(double precision, integer) TO %s', r);
  END LOOP;
  FOR r IN
    SELECT a.grantee::regrole FROM pg_class AS c, aclexplode(c.relacl) AS a
    WHERE c.oid = '{{schema}}.dead_letters'::regclass AND a.privilege_type = 'SELECT' AND a.grantee <> 0
  LOOP
    EXECUTE format('GRANT SELECT ON {{schema}}.inbox TO %s', r);
  END LOOP;
END
$$;
