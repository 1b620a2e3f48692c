-- Rows a transaction-held batch holds (leaseMode "transaction") carry no lease on the row: status, the
-- unprocessed and leases views and the unserved-queue check read them from their batch's live guard
-- instead (batch_leased(), whose live definition is its function file), so they show as leased, not ready
-- (a queue drained by such workers looked unserved). A function and views only: no lock on messages.
CREATE FUNCTION {{schema}}.batch_leased()
RETURNS TABLE (id bigint, worker text, created_at timestamptz)
LANGUAGE sql STABLE PARALLEL SAFE SECURITY DEFINER SET search_path = pg_catalog, pg_temp ROWS 10 AS $$
  SELECT u.id, g.worker, g.created_at
  FROM {{schema}}.lease_guards AS g CROSS JOIN LATERAL unnest(g.ids) AS u(id)
  WHERE pg_xact_status(g.xid) = 'in progress'
$$;
REVOKE ALL ON FUNCTION {{schema}}.batch_leased() FROM PUBLIC;

-- Held rows are looked up in a hashed set of the few held (built once per query), not joined: a join
-- would be planned as a merge along the primary key, and read a large backlog about twice as slowly.
CREATE OR REPLACE VIEW {{schema}}.unprocessed AS
SELECT
  m.id,
  m.queue,
  m.key,
  CASE
    WHEN m.acquired_token IS NULL AND m.id IN (SELECT b.id FROM {{schema}}.batch_leased() AS b) THEN 'leased'
    WHEN m.acquired_token IS NULL AND NOT m.head THEN 'blocked'
    WHEN m.acquired_token IS NULL AND m.available_at > now() THEN 'scheduled'
    WHEN m.acquired_token IS NULL THEN 'ready'
    WHEN m.lease_expires_at <= now() AND m.id IN (SELECT b.id FROM {{schema}}.batch_leased() AS b) THEN 'leased'
    WHEN m.lease_expires_at <= now() THEN 'lease_expired'
    ELSE 'leased'
  END AS state,
  now() - m.created_at AS age,
  m.payload,
  m.headers,
  m.created_at,
  m.available_at,
  CASE WHEN m.acquired_at IS NULL AND m.id IN (SELECT b.id FROM {{schema}}.batch_leased() AS b)
       THEN (SELECT b.created_at FROM {{schema}}.batch_leased() AS b WHERE b.id = m.id LIMIT 1)
       ELSE m.acquired_at END AS acquired_at,
  CASE WHEN m.acquired_at IS NULL AND m.id IN (SELECT b.id FROM {{schema}}.batch_leased() AS b)
       THEN (SELECT b.worker FROM {{schema}}.batch_leased() AS b WHERE b.id = m.id LIMIT 1)
       ELSE m.acquired_by END AS acquired_by,
  m.lease_expires_at,
  m.deliveries_count,
  m.attempts_count,
  m.first_attempt_at,
  m.last_attempt_at,
  m.last_error,
  m.failures_count,
  m.head
FROM {{schema}}.messages AS m;

-- A batch's rows under its worker, since the batch began, with no expiry (held until its transaction ends).
CREATE OR REPLACE VIEW {{schema}}.leases AS
SELECT m.id, m.queue, m.acquired_at, m.acquired_by, m.lease_expires_at
FROM {{schema}}.messages AS m
WHERE m.acquired_token IS NOT NULL
UNION ALL
SELECT m.id, m.queue, b.created_at, b.worker, NULL::timestamptz
FROM {{schema}}.batch_leased() AS b JOIN {{schema}}.messages AS m ON m.id = b.id;

-- The views call batch_leased() as whoever reads them: every role that reads the leases or unprocessed
-- view or all of messages (each tells more than it) keeps working until `grant` runs again.
DO $$
DECLARE
  r regrole;
BEGIN
  FOR r IN
    SELECT a.grantee::regrole FROM pg_class AS c, aclexplode(c.relacl) AS a
    WHERE c.oid IN ('{{schema}}.leases'::regclass, '{{schema}}.unprocessed'::regclass, '{{schema}}.messages'::regclass)
      AND a.privilege_type = 'SELECT' AND a.grantee <> 0
  LOOP
    EXECUTE format('GRANT EXECUTE ON FUNCTION {{schema}}.batch_leased() TO %s', r);
  END LOOP;
END
$$;
