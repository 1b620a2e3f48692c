-- notify_inserted: its live definition, (re)applied by the migrator whenever this file changes (see
-- docs/contributing/migrations.md). Change the body here, never in a numbered migration.
--
-- Optional wake-up trigger for producers that write plain SQL INSERTs (other languages, psql).
-- Not attached by default: every transaction that notifies takes a database-wide lock at commit.
-- Attach it with `outbox-worker trigger enable` (see the docs for its measured cost).
CREATE OR REPLACE FUNCTION {{schema}}.notify_inserted() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  -- One notification per queue per statement; Postgres folds duplicates within a transaction.
  PERFORM pg_notify({{channel}}, q.queue) FROM (SELECT DISTINCT queue FROM inserted) AS q;
  RETURN NULL;
END
$$;
