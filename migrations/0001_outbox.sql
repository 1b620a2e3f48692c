-- The outbox: messages waiting for delivery, the dead letters, and a lease-free view for people.
-- The migrator replaces the schema and channel placeholders with the validated, quoted names.

CREATE TABLE {{schema}}.messages (
  id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  queue            text        NOT NULL CHECK (queue <> '' AND octet_length(queue) <= 200),
  payload          jsonb       NOT NULL,
  headers          jsonb       NOT NULL DEFAULT '{}'::jsonb CHECK (jsonb_typeof(headers) = 'object'),
  key              text        NULL,
  created_at       timestamptz NOT NULL DEFAULT now(),
  -- Delays and retry backoff, always on the server clock.
  available_at     timestamptz NOT NULL DEFAULT now(),
  -- The lease: taken by one fetch, renewed by the heartbeat, cleared by a retry or a release.
  acquired_at      timestamptz NULL,
  acquired_token   uuid        NULL,
  acquired_by      text        NULL,
  -- Carried on the row so that readers (the view, status) can tell a live lease from an expired one
  -- without knowing the TTL of the worker that took it.
  lease_expires_at timestamptz NULL,
  deliveries_count integer     NOT NULL DEFAULT 0 CHECK (deliveries_count >= 0),
  attempts_count   integer     NOT NULL DEFAULT 0 CHECK (attempts_count >= 0),
  first_attempt_at timestamptz NULL,
  last_attempt_at  timestamptz NULL,
  last_error       text        NULL,
  CONSTRAINT messages_lease_complete CHECK (
    (acquired_token IS NULL) = (acquired_at IS NULL)
    AND (acquired_token IS NULL) = (lease_expires_at IS NULL)
  )
) WITH (
  -- Every message is inserted, updated (lease) and deleted: leave room on the page for the new row
  -- versions, and vacuum after a fixed number of dead rows rather than a fraction of a table that
  -- is usually near empty.
  fillfactor = 80,
  autovacuum_vacuum_scale_factor = 0,
  autovacuum_vacuum_threshold = 2000,
  autovacuum_vacuum_insert_scale_factor = 0,
  autovacuum_vacuum_insert_threshold = 10000,
  autovacuum_analyze_scale_factor = 0,
  autovacuum_analyze_threshold = 5000,
  autovacuum_vacuum_cost_delay = 1
);

-- One index per branch of the fetch predicate, so each branch is an index scan:
-- ready rows in delivery order, and leases ordered by expiry.
CREATE INDEX messages_ready_idx ON {{schema}}.messages (queue, available_at, id)
  WHERE acquired_token IS NULL;
CREATE INDEX messages_leased_idx ON {{schema}}.messages (queue, lease_expires_at)
  WHERE acquired_token IS NOT NULL;
-- Per-key ordering looks up the oldest row of a key.
CREATE INDEX messages_key_idx ON {{schema}}.messages (queue, key, id)
  WHERE key IS NOT NULL;

CREATE TABLE {{schema}}.dead_letters (
  id               bigint      PRIMARY KEY,
  queue            text        NOT NULL,
  payload          jsonb       NOT NULL,
  headers          jsonb       NOT NULL,
  key              text        NULL,
  created_at       timestamptz NOT NULL,
  available_at     timestamptz NOT NULL,
  acquired_by      text        NULL,
  deliveries_count integer     NOT NULL,
  attempts_count   integer     NOT NULL,
  first_attempt_at timestamptz NULL,
  last_attempt_at  timestamptz NULL,
  dead_at          timestamptz NOT NULL DEFAULT now(),
  reason           text        NOT NULL CHECK (reason ~ '^[a-z_]{1,64}$'),
  error            text        NULL
);
CREATE INDEX dead_letters_queue_dead_at_idx ON {{schema}}.dead_letters (queue, dead_at);
CREATE INDEX dead_letters_dead_at_idx ON {{schema}}.dead_letters (dead_at);

-- What people look at: every row still to deliver, with its state and age. A plain view over the
-- table: reading it takes no row lock, no lease, and changes nothing.
CREATE VIEW {{schema}}.unprocessed AS
SELECT
  m.id,
  m.queue,
  m.key,
  CASE
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
  m.acquired_at,
  m.acquired_by,
  m.lease_expires_at,
  m.deliveries_count,
  m.attempts_count,
  m.first_attempt_at,
  m.last_attempt_at,
  m.last_error
FROM {{schema}}.messages AS m;

-- Optional wake-up trigger for producers that write plain SQL INSERTs (other languages, psql).
-- Not attached by default: every transaction that notifies takes a database-wide lock at commit.
-- Attach it with `outbox-worker trigger enable` (see README for its measured cost).
CREATE FUNCTION {{schema}}.notify_inserted() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  -- One notification per queue per statement; Postgres folds duplicates within a transaction.
  PERFORM pg_notify({{channel}}, q.queue) FROM (SELECT DISTINCT queue FROM inserted) AS q;
  RETURN NULL;
END
$$;
