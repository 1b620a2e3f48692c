-- promote_heads: its live definition, (re)applied by the migrator whenever this file changes (see
-- docs/contributing/migrations.md). Change the body here, never in a numbered migration.
--
-- The oldest row left of each key becomes its head; up to hand_off of them that are due are leased at once
-- under hand_token (a hand-off: the caller runs them next, without a fetch). Run after the heads' removal,
-- in the same transaction, holding the keys' locks. promote_heads_after from the start of each key.
CREATE OR REPLACE FUNCTION {{schema}}.promote_heads(
  queues text[], keys text[], hand_off integer, hand_token uuid, lease_ttl_ms double precision, worker_id text
) RETURNS TABLE (
  id text, queue text, payload text, headers jsonb, key text, created_epoch double precision,
  deliveries_count integer, attempts_count integer, failures_count integer,
  first_attempt_at timestamptz, last_attempt_at timestamptz, taken boolean
)
LANGUAGE sql AS $$
  SELECT * FROM {{schema}}.promote_heads_after(
    queues, keys, array_fill(0::bigint, ARRAY[cardinality(keys)]), hand_off, hand_token, lease_ttl_ms, worker_id
  )
$$;
