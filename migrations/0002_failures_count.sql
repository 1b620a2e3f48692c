-- Failures that count towards a queue's maxAttempts. Transient failures (a broker down, a timeout) are
-- attempts too (attempts_count) but never count here, so a long outage cannot dead-letter valid messages.
ALTER TABLE {{schema}}.messages
  ADD COLUMN failures_count integer NOT NULL DEFAULT 0 CHECK (failures_count >= 0);
ALTER TABLE {{schema}}.dead_letters
  ADD COLUMN failures_count integer NOT NULL DEFAULT 0;

CREATE OR REPLACE VIEW {{schema}}.unprocessed AS
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
  m.last_error,
  m.failures_count
FROM {{schema}}.messages AS m;
