-- Rows a transaction-held batch holds (leaseMode "transaction") carry no lease on the row: status, the
-- unprocessed and leases views and the unserved-queue check read them from their batch's live guard
-- instead, so they show as leased, not ready (a queue drained by such workers looked unserved). Views
-- only: no lock on messages.
CREATE VIEW {{schema}}.batch_leases AS
SELECT u.id, g.worker, g.created_at
FROM {{schema}}.lease_guards AS g CROSS JOIN LATERAL unnest(g.ids) AS u(id)
-- A guard outlives its transaction only until the repair counts it: a crash, not a holder.
WHERE pg_xact_status(g.xid) = 'in progress';

CREATE OR REPLACE VIEW {{schema}}.unprocessed AS
SELECT
  m.id,
  m.queue,
  m.key,
  CASE
    WHEN b.id IS NOT NULL THEN 'leased'
    WHEN m.acquired_token IS NULL AND NOT m.head THEN 'blocked'
    WHEN m.acquired_token IS NULL AND m.available_at > now() THEN 'scheduled'
    WHEN m.acquired_token IS NULL THEN 'ready'
    WHEN m.lease_expires_at <= now() THEN 'lease_expired'
    ELSE 'leased'
  END AS state,
  now() - m.created_at AS age,
  m.payload,
  m.headers,
  m.created_at,
  m.available_at,
  COALESCE(m.acquired_at, b.created_at) AS acquired_at,
  COALESCE(m.acquired_by, b.worker) AS acquired_by,
  m.lease_expires_at,
  m.deliveries_count,
  m.attempts_count,
  m.first_attempt_at,
  m.last_attempt_at,
  m.last_error,
  m.failures_count,
  m.head
FROM {{schema}}.messages AS m
LEFT JOIN {{schema}}.batch_leases AS b ON b.id = m.id;

-- A batch's rows under its worker, since the batch began, with no expiry (held until its transaction ends).
CREATE OR REPLACE VIEW {{schema}}.leases AS
SELECT m.id, m.queue, m.acquired_at, m.acquired_by, m.lease_expires_at
FROM {{schema}}.messages AS m
WHERE m.acquired_token IS NOT NULL
UNION ALL
SELECT m.id, m.queue, b.created_at, b.worker, NULL::timestamptz
FROM {{schema}}.batch_leases AS b JOIN {{schema}}.messages AS m ON m.id = b.id;

-- Status reads batch_leases beside messages: every role that reads the leases view or the whole messages
-- table (both tell more than this view) keeps working until `grant` runs again.
DO $$
DECLARE
  r regrole;
BEGIN
  FOR r IN
    SELECT a.grantee::regrole FROM pg_class AS c, aclexplode(c.relacl) AS a
    WHERE c.oid IN ('{{schema}}.leases'::regclass, '{{schema}}.messages'::regclass)
      AND a.privilege_type = 'SELECT' AND a.grantee <> 0
  LOOP
    EXECUTE format('GRANT SELECT ON {{schema}}.batch_leases TO %s', r);
  END LOOP;
END
$$;
