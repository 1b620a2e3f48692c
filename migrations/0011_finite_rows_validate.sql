-- outbox:no-transaction
-- Rows from before 0010 with an infinite time get a finite one (now(); for a lease, an expired one) and say
-- so in last_error; then the CHECKs are validated, under a lock that lets producers and workers go on.
UPDATE {{schema}}.messages SET
  created_at = CASE WHEN isfinite(created_at) THEN created_at ELSE now() END,
  available_at = CASE WHEN isfinite(available_at) THEN available_at ELSE now() END,
  acquired_at = CASE WHEN acquired_at IS NULL OR isfinite(acquired_at) THEN acquired_at ELSE now() END,
  lease_expires_at = CASE WHEN lease_expires_at IS NULL OR isfinite(lease_expires_at) THEN lease_expires_at
                          ELSE now() END,
  first_attempt_at = CASE WHEN isfinite(first_attempt_at) THEN first_attempt_at END,
  last_attempt_at = CASE WHEN isfinite(last_attempt_at) THEN last_attempt_at END,
  last_error = left(concat_ws(' | ', 'an infinite timestamp was replaced by migration 0011', last_error), 4000)
WHERE NOT (isfinite(created_at) AND isfinite(available_at) AND (acquired_at IS NULL OR isfinite(acquired_at))
           AND (lease_expires_at IS NULL OR isfinite(lease_expires_at))
           AND (first_attempt_at IS NULL OR isfinite(first_attempt_at))
           AND (last_attempt_at IS NULL OR isfinite(last_attempt_at)));
UPDATE {{schema}}.dead_letters SET
  created_at = CASE WHEN isfinite(created_at) THEN created_at ELSE now() END,
  dead_at = CASE WHEN isfinite(dead_at) THEN dead_at ELSE now() END
WHERE NOT (isfinite(created_at) AND isfinite(dead_at));
ALTER TABLE {{schema}}.messages VALIDATE CONSTRAINT messages_finite_times;
ALTER TABLE {{schema}}.dead_letters VALIDATE CONSTRAINT dead_letters_finite_times;
