-- batch_leased: its live definition, (re)applied by the migrator whenever this file changes (see
-- docs/contributing/migrations.md). Change the body here, never in a numbered migration.
--
-- The rows transaction-held batches (leaseMode "transaction") hold now, with the batch's worker and start:
-- the ids of the guards whose transaction is in progress (a guard left by a crash is not a holder). Rows
-- such a batch holds carry no lease, so status, the unprocessed and leases views and the unserved-queue
-- check read them here. STABLE although pg_xact_status is not: read once per statement (a batch committing
-- meanwhile may still show), so the views over messages that call it keep their plans (a volatile call
-- would keep the planner from flattening them). ROWS 10: a handful of batches. SECURITY DEFINER, its
-- search_path pinned: callers need EXECUTE, no right on lease_guards.
CREATE OR REPLACE FUNCTION {{schema}}.batch_leased()
RETURNS TABLE (id bigint, worker text, created_at timestamptz)
LANGUAGE sql STABLE PARALLEL SAFE SECURITY DEFINER SET search_path = pg_catalog, pg_temp ROWS 10 AS $$
  SELECT u.id, g.worker, g.created_at
  FROM {{schema}}.lease_guards AS g CROSS JOIN LATERAL unnest(g.ids) AS u(id)
  WHERE pg_xact_status(g.xid) = 'in progress'
$$;
