-- The outbox schema as a freshly migrated database has it: generated from the catalog by
-- `npm run schema:dump` (scripts/schema-dump.ts), never edited by hand.
-- test/migrate/schema-drift.test.ts fails when the migrations and this file disagree. Function bodies
-- live in migrations/functions/, one file each.

CREATE SCHEMA outbox;

CREATE TABLE outbox.dead_letters (
  id bigint NOT NULL,
  queue text NOT NULL,
  payload jsonb NOT NULL,
  headers jsonb NOT NULL,
  key text,
  created_at timestamp with time zone NOT NULL,
  available_at timestamp with time zone NOT NULL,
  acquired_by text,
  deliveries_count integer NOT NULL,
  attempts_count integer NOT NULL,
  first_attempt_at timestamp with time zone,
  last_attempt_at timestamp with time zone,
  dead_at timestamp with time zone DEFAULT now() NOT NULL,
  reason text NOT NULL,
  error text,
  failures_count integer DEFAULT 0 NOT NULL
);
ALTER TABLE outbox.dead_letters ADD CONSTRAINT dead_letters_finite_times CHECK (isfinite(created_at) AND isfinite(dead_at));
ALTER TABLE outbox.dead_letters ADD CONSTRAINT dead_letters_pkey PRIMARY KEY (id);
ALTER TABLE outbox.dead_letters ADD CONSTRAINT dead_letters_reason_check CHECK (reason ~ '^[a-z_]{1,64}$'::text);
CREATE INDEX dead_letters_dead_at_idx ON outbox.dead_letters USING btree (dead_at);
CREATE INDEX dead_letters_queue_dead_at_idx ON outbox.dead_letters USING btree (queue, dead_at);
CREATE INDEX dead_letters_unrouted_idx ON outbox.dead_letters USING btree (queue, dead_at) WHERE (reason = 'no_subscribers'::text);

CREATE TABLE outbox.inbox (
  consumer text NOT NULL,
  dedupe_key text NOT NULL,
  handled_at timestamp with time zone DEFAULT now() NOT NULL,
  message_id bigint NOT NULL,
  queue text NOT NULL
);
ALTER TABLE outbox.inbox ADD CONSTRAINT inbox_pkey PRIMARY KEY (consumer, dedupe_key);
CREATE INDEX inbox_handled_at_idx ON outbox.inbox USING btree (handled_at);

CREATE TABLE outbox.lease_guards (
  id bigint GENERATED ALWAYS AS IDENTITY NOT NULL,
  ids bigint[] NOT NULL,
  xid xid8 NOT NULL,
  worker text NOT NULL,
  created_at timestamp with time zone DEFAULT now() NOT NULL,
  alone boolean DEFAULT false NOT NULL
);
ALTER TABLE outbox.lease_guards ADD CONSTRAINT lease_guards_pkey PRIMARY KEY (id);

CREATE TABLE outbox.messages (
  id bigint GENERATED ALWAYS AS IDENTITY NOT NULL,
  queue text NOT NULL,
  payload jsonb NOT NULL,
  headers jsonb DEFAULT '{}'::jsonb NOT NULL,
  key text,
  created_at timestamp with time zone DEFAULT now() NOT NULL,
  available_at timestamp with time zone DEFAULT now() NOT NULL,
  acquired_at timestamp with time zone,
  acquired_token uuid,
  acquired_by text,
  lease_expires_at timestamp with time zone,
  deliveries_count integer DEFAULT 0 NOT NULL,
  attempts_count integer DEFAULT 0 NOT NULL,
  first_attempt_at timestamp with time zone,
  last_attempt_at timestamp with time zone,
  last_error text,
  failures_count integer DEFAULT 0 NOT NULL,
  head boolean DEFAULT true NOT NULL,
  below_head boolean DEFAULT false NOT NULL,
  topic text,
  dedupe_key text
) WITH (
  autovacuum_analyze_scale_factor=0,
  autovacuum_analyze_threshold=5000,
  autovacuum_vacuum_cost_delay=1,
  autovacuum_vacuum_insert_scale_factor=0,
  autovacuum_vacuum_insert_threshold=10000,
  autovacuum_vacuum_scale_factor=0,
  autovacuum_vacuum_threshold=2000,
  fillfactor=40
);
ALTER TABLE outbox.messages ADD CONSTRAINT messages_attempts_count_check CHECK (attempts_count >= 0);
ALTER TABLE outbox.messages ADD CONSTRAINT messages_dedupe_key_bounded CHECK (dedupe_key <> ''::text AND octet_length(dedupe_key) <= 1024);
ALTER TABLE outbox.messages ADD CONSTRAINT messages_deliveries_count_check CHECK (deliveries_count >= 0);
ALTER TABLE outbox.messages ADD CONSTRAINT messages_failures_count_check CHECK (failures_count >= 0);
ALTER TABLE outbox.messages ADD CONSTRAINT messages_finite_times CHECK (isfinite(created_at) AND isfinite(available_at) AND (acquired_at IS NULL OR isfinite(acquired_at)) AND (lease_expires_at IS NULL OR isfinite(lease_expires_at)) AND (first_attempt_at IS NULL OR isfinite(first_attempt_at)) AND (last_attempt_at IS NULL OR isfinite(last_attempt_at)));
ALTER TABLE outbox.messages ADD CONSTRAINT messages_headers_check CHECK (jsonb_typeof(headers) = 'object'::text);
ALTER TABLE outbox.messages ADD CONSTRAINT messages_lease_complete CHECK ((acquired_token IS NULL) = (acquired_at IS NULL) AND (acquired_token IS NULL) = (lease_expires_at IS NULL));
ALTER TABLE outbox.messages ADD CONSTRAINT messages_pkey PRIMARY KEY (id);
ALTER TABLE outbox.messages ADD CONSTRAINT messages_queue_check CHECK (queue <> ''::text AND octet_length(queue) <= 200);
CREATE INDEX messages_behind_idx ON outbox.messages USING btree (queue, available_at, id) WHERE (NOT head);
CREATE INDEX messages_below_head_idx ON outbox.messages USING btree (queue, key, id) WHERE below_head;
CREATE UNIQUE INDEX messages_dedupe_key_idx ON outbox.messages USING btree (queue, dedupe_key) WHERE (dedupe_key IS NOT NULL);
CREATE INDEX messages_due_idx ON outbox.messages USING btree (queue, available_at, id) WHERE head;
CREATE INDEX messages_key_idx ON outbox.messages USING btree (queue, key, id) WHERE (key IS NOT NULL);
CREATE TRIGGER messages_expand_topic BEFORE INSERT ON outbox.messages FOR EACH ROW WHEN (new.topic IS NOT NULL) EXECUTE FUNCTION outbox.expand_topic();
CREATE TRIGGER messages_key_head BEFORE INSERT ON outbox.messages FOR EACH ROW WHEN (new.key IS NOT NULL) EXECUTE FUNCTION outbox.mark_key_head();

CREATE TABLE outbox.schema_functions (
  name text NOT NULL,
  checksum text NOT NULL,
  package_version text NOT NULL,
  applied_at timestamp with time zone DEFAULT now() NOT NULL,
  replaced_checksums text[] DEFAULT '{}'::text[] NOT NULL
);
ALTER TABLE outbox.schema_functions ADD CONSTRAINT schema_functions_pkey PRIMARY KEY (name);

CREATE TABLE outbox.schema_migrations (
  version integer NOT NULL,
  name text NOT NULL,
  checksum text NOT NULL,
  applied_at timestamp with time zone DEFAULT now() NOT NULL
);
ALTER TABLE outbox.schema_migrations ADD CONSTRAINT schema_migrations_pkey PRIMARY KEY (version);

CREATE TABLE outbox.subscriptions (
  pattern text NOT NULL,
  queue text NOT NULL,
  created_at timestamp with time zone DEFAULT now() NOT NULL,
  wildcard boolean GENERATED ALWAYS AS ((pattern ~ '(^|\.)[*#](\.|$)'::text)) STORED,
  matcher text GENERATED ALWAYS AS (outbox.topic_matcher(pattern)) STORED
);
ALTER TABLE outbox.subscriptions ADD CONSTRAINT subscriptions_pkey PRIMARY KEY (pattern, queue);
ALTER TABLE outbox.subscriptions ADD CONSTRAINT subscriptions_queue_check CHECK (queue ~ '^[A-Za-z0-9][A-Za-z0-9._:/-]*$'::text AND octet_length(queue) <= 200);
CREATE INDEX subscriptions_queue_idx ON outbox.subscriptions USING btree (queue);

CREATE VIEW outbox.leases AS
 SELECT m.id,
    m.queue,
    m.acquired_at,
    m.acquired_by,
    m.lease_expires_at
   FROM outbox.messages m
  WHERE m.acquired_token IS NOT NULL
UNION ALL
 SELECT m.id,
    m.queue,
    b.created_at AS acquired_at,
    b.worker AS acquired_by,
    NULL::timestamp with time zone AS lease_expires_at
   FROM outbox.batch_leased() b(id, worker, created_at)
     JOIN outbox.messages m ON m.id = b.id;

CREATE VIEW outbox.unprocessed AS
 SELECT id,
    queue,
    key,
        CASE
            WHEN acquired_token IS NULL AND (id IN ( SELECT b.id
               FROM outbox.batch_leased() b(id, worker, created_at))) THEN 'leased'::text
            WHEN acquired_token IS NULL AND NOT head THEN 'blocked'::text
            WHEN acquired_token IS NULL AND available_at > now() THEN 'scheduled'::text
            WHEN acquired_token IS NULL THEN 'ready'::text
            WHEN lease_expires_at <= now() AND (id IN ( SELECT b.id
               FROM outbox.batch_leased() b(id, worker, created_at))) THEN 'leased'::text
            WHEN lease_expires_at <= now() THEN 'lease_expired'::text
            ELSE 'leased'::text
        END AS state,
    now() - created_at AS age,
    payload,
    headers,
    created_at,
    available_at,
        CASE
            WHEN acquired_at IS NULL AND (id IN ( SELECT b.id
               FROM outbox.batch_leased() b(id, worker, created_at))) THEN ( SELECT b.created_at
               FROM outbox.batch_leased() b(id, worker, created_at)
              WHERE b.id = m.id
             LIMIT 1)
            ELSE acquired_at
        END AS acquired_at,
        CASE
            WHEN acquired_at IS NULL AND (id IN ( SELECT b.id
               FROM outbox.batch_leased() b(id, worker, created_at))) THEN ( SELECT b.worker
               FROM outbox.batch_leased() b(id, worker, created_at)
              WHERE b.id = m.id
             LIMIT 1)
            ELSE acquired_by
        END AS acquired_by,
    lease_expires_at,
    deliveries_count,
    attempts_count,
    first_attempt_at,
    last_attempt_at,
    last_error,
    failures_count,
    head
   FROM outbox.messages m;

CREATE OR REPLACE FUNCTION outbox.ack_key_heads(ids bigint[], tokens uuid[], queues text[], keys text[], hand_off integer, hand_token uuid, lease_ttl_ms double precision, worker_id text, wait_for_flush boolean)
 RETURNS TABLE(kind text, delivery text, id text, queue text, payload text, headers jsonb, key text, created_epoch double precision, deliveries_count integer, attempts_count integer, failures_count integer, first_attempt_at timestamp with time zone, last_attempt_at timestamp with time zone, taken boolean)
 LANGUAGE plpgsql
AS $function$
#variable_conflict use_column
DECLARE
  deleted integer;
  written bigint[];
  written_tokens uuid[];
  head_queues text[];
  head_keys text[];
  head_ids bigint[];
BEGIN
  IF NOT wait_for_flush THEN
    PERFORM set_config('synchronous_commit', 'off', true);
  END IF;
  WITH tried AS MATERIALIZED (
    -- Only tried, never waited for: waiting could deadlock with a producer taking several keys' locks.
    -- Materialised, so the lock is tried once per delivery and never on another row the plan reads.
    SELECT d.id, d.token, d.key IS NOT NULL AND pg_try_advisory_xact_lock(hashtext(d.queue), hashtext(d.key)) AS locked
    FROM unnest(ids, tokens, queues, keys) AS d(id, token, queue, key)
  ), gone AS (
    DELETE FROM outbox.messages AS t USING tried AS k
    -- A head whose lock a producer holds stays (busy below).
    WHERE t.id = k.id AND COALESCE(t.acquired_token, '00000000-0000-0000-0000-000000000000'::uuid) = k.token AND (t.key IS NULL OR NOT t.head OR k.locked)
    RETURNING t.id, k.token, t.queue, t.key, t.head
  )
  -- Not yet as text: the deliveries written are named only when some were not.
  SELECT count(*), array_agg(g.id), array_agg(g.token),
         array_agg(g.queue) FILTER (WHERE g.key IS NOT NULL AND g.head),
         array_agg(g.key) FILTER (WHERE g.key IS NOT NULL AND g.head),
         array_agg(g.id) FILTER (WHERE g.key IS NOT NULL AND g.head)
  INTO deleted, written, written_tokens, head_queues, head_keys, head_ids
  FROM gone AS g;
  RETURN QUERY SELECT 'deleted', deleted::text, NULL::text, NULL::text, NULL::text, NULL::jsonb, NULL::text,
                      NULL::float8, NULL::int, NULL::int, NULL::int, NULL::timestamptz, NULL::timestamptz,
                      NULL::boolean;
  IF deleted < cardinality(ids) THEN
    RETURN QUERY SELECT 'written', w.id::text || '/' || w.token::text, NULL::text, NULL::text, NULL::text,
                        NULL::jsonb, NULL::text, NULL::float8, NULL::int, NULL::int, NULL::int,
                        NULL::timestamptz, NULL::timestamptz, NULL::boolean
                 FROM unnest(written, written_tokens) AS w(id, token);
    -- This statement sees the deletions above: what is still ours and heads a key was busy.
    RETURN QUERY SELECT 'busy', t.id::text || '/' || COALESCE(t.acquired_token, '00000000-0000-0000-0000-000000000000'::uuid)::text, NULL::text, NULL::text, NULL::text,
                        NULL::jsonb, NULL::text, NULL::float8, NULL::int, NULL::int, NULL::int,
                        NULL::timestamptz, NULL::timestamptz, NULL::boolean
                 FROM unnest(ids, tokens) AS b(id, token)
                 JOIN outbox.messages AS t ON t.id = b.id AND COALESCE(t.acquired_token, '00000000-0000-0000-0000-000000000000'::uuid) = b.token
                 WHERE t.key IS NOT NULL AND t.head;
  END IF;
  IF head_keys IS NOT NULL THEN
    -- A statement of its own, so a fresh snapshot taken while the locks are held: it sees every row a
    -- producer of these keys committed.
    RETURN QUERY SELECT 'promoted', NULL::text, p.*
                 FROM outbox.promote_heads_after(head_queues, head_keys, head_ids, hand_off, hand_token, lease_ttl_ms, worker_id) AS p;
  END IF;
END
$function$;

CREATE OR REPLACE FUNCTION outbox.ack_keyed(ids bigint[], tokens uuid[], hand_off integer, hand_token uuid, lease_ttl_ms double precision, worker_id text, wait_for_flush boolean)
 RETURNS TABLE(kind text, delivery text, id text, queue text, payload text, headers jsonb, key text, created_epoch double precision, deliveries_count integer, attempts_count integer, failures_count integer, first_attempt_at timestamp with time zone, last_attempt_at timestamp with time zone, taken boolean)
 LANGUAGE plpgsql
AS $function$
#variable_conflict use_column
DECLARE
  deleted integer;
  written text[];
  head_queues text[];
  head_keys text[];
BEGIN
  IF NOT wait_for_flush THEN
    PERFORM set_config('synchronous_commit', 'off', true);
  END IF;
  WITH mine AS MATERIALIZED (
    SELECT t.id, d.token, t.queue, t.key, t.head
    FROM unnest(ids, tokens) AS d(id, token) JOIN outbox.messages AS t ON t.id = d.id AND COALESCE(t.acquired_token, '00000000-0000-0000-0000-000000000000'::uuid) = d.token
  ), kept AS MATERIALIZED (
    -- The lock is tried on the deliveries' own rows only (materialised first): a filter on the table would
    -- run on every leased row the planner scans and hold the locks of other workers' keys until commit.
    SELECT k.id, k.token, k.key IS NOT NULL AND k.head AS locked FROM mine AS k
    WHERE k.key IS NULL OR NOT k.head OR pg_try_advisory_xact_lock(hashtext(k.queue), hashtext(k.key))
  ), gone AS (
    DELETE FROM outbox.messages AS t USING kept AS k
    -- A row promoted since `mine` read it (an unordered queue's) is a head without its lock: busy.
    WHERE t.id = k.id AND COALESCE(t.acquired_token, '00000000-0000-0000-0000-000000000000'::uuid) = k.token AND (t.key IS NULL OR NOT t.head OR k.locked)
    RETURNING t.id::text || '/' || k.token::text AS delivery, t.queue, t.key, t.head
  )
  SELECT count(*), array_agg(g.delivery),
         array_agg(g.queue) FILTER (WHERE g.key IS NOT NULL AND g.head),
         array_agg(g.key) FILTER (WHERE g.key IS NOT NULL AND g.head)
  INTO deleted, written, head_queues, head_keys
  FROM gone AS g;
  RETURN QUERY SELECT 'deleted', deleted::text, NULL::text, NULL::text, NULL::text, NULL::jsonb, NULL::text,
                      NULL::float8, NULL::int, NULL::int, NULL::int, NULL::timestamptz, NULL::timestamptz,
                      NULL::boolean;
  IF deleted < cardinality(ids) THEN
    RETURN QUERY SELECT 'written', w, NULL::text, NULL::text, NULL::text, NULL::jsonb, NULL::text,
                        NULL::float8, NULL::int, NULL::int, NULL::int, NULL::timestamptz, NULL::timestamptz,
                        NULL::boolean
                 FROM unnest(written) AS w;
    -- This statement sees the deletions above: what is still ours and heads a key was busy.
    RETURN QUERY SELECT 'busy', t.id::text || '/' || COALESCE(t.acquired_token, '00000000-0000-0000-0000-000000000000'::uuid)::text, NULL::text, NULL::text, NULL::text,
                        NULL::jsonb, NULL::text, NULL::float8, NULL::int, NULL::int, NULL::int,
                        NULL::timestamptz, NULL::timestamptz, NULL::boolean
                 FROM unnest(ids, tokens) AS b(id, token)
                 JOIN outbox.messages AS t ON t.id = b.id AND COALESCE(t.acquired_token, '00000000-0000-0000-0000-000000000000'::uuid) = b.token
                 WHERE t.key IS NOT NULL AND t.head;
  END IF;
  IF head_keys IS NOT NULL THEN
    RETURN QUERY SELECT 'promoted', NULL::text, p.*
                 FROM outbox.promote_heads(head_queues, head_keys, hand_off, hand_token, lease_ttl_ms, worker_id) AS p;
  END IF;
END
$function$;

CREATE OR REPLACE FUNCTION outbox.batch_leased()
 RETURNS TABLE(id bigint, worker text, created_at timestamp with time zone)
 LANGUAGE sql
 STABLE PARALLEL SAFE SECURITY DEFINER ROWS 10
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
  SELECT u.id, g.worker, g.created_at
  FROM outbox.lease_guards AS g CROSS JOIN LATERAL unnest(g.ids) AS u(id)
  WHERE pg_xact_status(g.xid) = 'in progress'
$function$;
REVOKE ALL ON FUNCTION outbox.batch_leased() FROM PUBLIC;

CREATE OR REPLACE FUNCTION outbox.cancel(cancel_queue text, cancel_dedupe_key text)
 RETURNS TABLE(status text, id bigint)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
#variable_conflict use_column
DECLARE
  found_id bigint;
  found_key text;
  found_held boolean;
  gone_id bigint;
  gone_key text;
  gone_head boolean;
BEGIN
  -- Bounded: each round either ends or saw the row go (acked, or replaced by a new message with the same
  -- dedupe key) between its read and its lock.
  FOR attempt IN 1 .. 5 LOOP
    -- A lease is live until lease_expires_at on the server clock: statement_timestamp(), not the caller's
    -- transaction start (now()), which may be long past. An expired lease's holder is presumed dead (a
    -- fetch would take the row over) and is fenced by its token: its late ack writes nothing.
    SELECT m.id, m.key, m.acquired_token IS NOT NULL AND m.lease_expires_at > statement_timestamp()
    INTO found_id, found_key, found_held
    FROM outbox.messages AS m
    WHERE m.queue = cancel_queue AND m.dedupe_key = cancel_dedupe_key;
    IF found_id IS NULL THEN
      RETURN QUERY SELECT 'not_found'::text, NULL::bigint;
      RETURN;
    END IF;
    -- Held by a live lease, or by a batch whose transaction is in progress (its guard names the row): the
    -- answer needs no lock, and the key's lock is left to the worker's ack.
    IF found_held OR EXISTS (SELECT 1 FROM outbox.batch_leased() AS b WHERE b.id = found_id) THEN
      RETURN QUERY SELECT 'delivering'::text, found_id;
      RETURN;
    END IF;
    BEGIN
      -- Locks in the order every completion takes them: the key's lock, then the row. The key's lock is
      -- waited for (a producer of the key may be in flight: a promotion now could miss its row) holding
      -- nothing of this cancel's; the row is only tried (SKIP LOCKED): a row a worker locks is its own.
      -- A keyless message has no key lock: its dedupe key's own one (apart from the key locks: 'cancel '
      -- salts the queue's hash) makes a second cancel of it wait for the first one's transaction, so that
      -- the row lock of a cancel's deletion is never taken for a worker's.
      IF found_key IS NOT NULL THEN
        PERFORM pg_advisory_xact_lock(hashtext(cancel_queue), hashtext(found_key));
      ELSE
        PERFORM pg_advisory_xact_lock(hashtext('cancel ' || cancel_queue), hashtext(cancel_dedupe_key));
      END IF;
      PERFORM 1 FROM outbox.messages AS t
      WHERE t.id = found_id AND t.dedupe_key = cancel_dedupe_key
        AND (t.acquired_token IS NULL OR t.lease_expires_at <= statement_timestamp())
      FOR UPDATE OF t SKIP LOCKED;
      IF NOT FOUND THEN
        -- Locked by another transaction, leased meanwhile, or gone: this round took nothing (the key's
        -- lock goes with the subtransaction).
        RAISE EXCEPTION USING ERRCODE = 'OXC01';
      END IF;
      DELETE FROM outbox.messages AS t WHERE t.id = found_id
      RETURNING t.id, t.key, t.head INTO gone_id, gone_key, gone_head;
      -- The key's successor becomes head as after an ack of the head: its own statement (a fresh snapshot
      -- seeing every row a producer of the key committed), holding the key's lock. No hand-off: nobody here
      -- runs handlers.
      IF gone_key IS NOT NULL AND gone_head THEN
        PERFORM count(*) FROM outbox.promote_heads_after(
          ARRAY[cancel_queue], ARRAY[gone_key], ARRAY[gone_id], 0, NULL::uuid, 0, NULL::text);
      END IF;
      RETURN QUERY SELECT 'cancelled'::text, gone_id;
      RETURN;
    EXCEPTION WHEN SQLSTATE 'OXC01' THEN
      NULL;
    END;
    -- Still there: a worker holds it or is taking it (a batch whose guard is not committed yet, a fetch, a
    -- completion of its lease). Gone: look again (acked, or a new message with the key).
    IF EXISTS (SELECT 1 FROM outbox.messages AS t
               WHERE t.id = found_id AND t.dedupe_key = cancel_dedupe_key) THEN
      RETURN QUERY SELECT 'delivering'::text, found_id;
      RETURN;
    END IF;
    found_id := NULL;
  END LOOP;
  RAISE EXCEPTION USING ERRCODE = '40001',
    MESSAGE = 'outbox: cancel: the message kept changing under the cancel; try again';
END
$function$;
REVOKE ALL ON FUNCTION outbox.cancel(text,text) FROM PUBLIC;

CREATE OR REPLACE FUNCTION outbox.copy_to_queues(topic text, queues text[], items jsonb, keep_unrouted boolean)
 RETURNS TABLE(ord integer, id bigint, queue text)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
 SET plan_cache_mode TO 'force_generic_plan'
AS $function$
#variable_conflict use_column
DECLARE
  n integer;
BEGIN
  IF topic IS NULL OR octet_length(topic) > 200 OR topic !~ '^[A-Za-z0-9_:/-]+(\.[A-Za-z0-9_:/-]+)*$' THEN
    RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = format(
      'outbox: %s is not a topic name: dot-separated segments of letters, digits and _ : / -, at most 200 bytes',
      coalesce(left(quote_literal(topic), 60), 'null'));
  END IF;
  IF items IS NULL OR jsonb_typeof(items) <> 'array' THEN
    RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'outbox: fan_out items must be a JSON array';
  END IF;
  IF queues IS NULL OR array_position(queues, NULL) IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'outbox: copy_to_queues queues must be an array of queue names';
  END IF;
  n := cardinality(queues);
  IF n = 0 THEN
    IF keep_unrouted THEN
      INSERT INTO outbox.dead_letters
        (id, queue, payload, headers, key, created_at, available_at, deliveries_count, attempts_count,
         failures_count, reason, error)
      SELECT nextval(pg_get_serial_sequence('outbox.messages', 'id')), topic, e.item -> 'payload',
             coalesce(e.item -> 'headers', '{}') || jsonb_build_object('outbox-topic', topic),
             e.item ->> 'key', now(),
             coalesce((e.item ->> 'available_at')::timestamptz,
                      now() + coalesce((e.item ->> 'delay_ms')::double precision, 0) * interval '1 millisecond'),
             0, 0, 0, 'no_subscribers', format('no queue subscribes to topic %s', topic)
      FROM jsonb_array_elements(items) WITH ORDINALITY AS e(item, o)
      ORDER BY e.o;
    END IF;
    RETURN;
  END IF;
  -- Every (queue, key) lock before any id, in (queue, key) order as publish, publishMany and replay take
  -- them: ids then follow commit order within each subscriber's key, and two producers cannot deadlock.
  -- Skipped when no event has a key (nothing to order).
  IF jsonb_path_exists(items, '$[*].key ? (@ != null)') THEN
    PERFORM count(*) FROM (
      SELECT pg_advisory_xact_lock(hashtext(k.queue), hashtext(k.key)) FROM (
        SELECT DISTINCT q.queue, i.item ->> 'key' AS key
        FROM unnest(queues) AS q(queue) CROSS JOIN jsonb_array_elements(items) AS i(item)
        WHERE i.item ->> 'key' IS NOT NULL ORDER BY 1, 2
      ) AS k
    ) AS taken;
  END IF;
  -- Ids are drawn in the SELECT's order (item, then queue): the n-th id is item (n-1)/queues + 1.
  RETURN QUERY
  WITH ins AS (
    INSERT INTO outbox.messages AS m (queue, payload, headers, key, available_at)
    SELECT q.queue, e.item -> 'payload',
           coalesce(e.item -> 'headers', '{}') || jsonb_build_object('outbox-topic', topic),
           e.item ->> 'key',
           coalesce((e.item ->> 'available_at')::timestamptz,
                    now() + coalesce((e.item ->> 'delay_ms')::double precision, 0) * interval '1 millisecond')
    FROM jsonb_array_elements(items) WITH ORDINALITY AS e(item, o)
    CROSS JOIN unnest(queues) WITH ORDINALITY AS q(queue, qo)
    ORDER BY e.o, q.qo
    RETURNING m.id, m.queue
  )
  SELECT ((row_number() OVER (ORDER BY ins.id) - 1) / n + 1)::integer, ins.id, ins.queue
  FROM ins ORDER BY ins.id;
END
$function$;

CREATE OR REPLACE FUNCTION outbox.dead_letter(ids bigint[], tokens uuid[], reasons text[], errors text[], attempted_flags integer[], failed_flags integer[], max_error_length integer, wait_for_flush boolean)
 RETURNS TABLE(keys text[], busy text[], head_queues text[], head_keys text[])
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
#variable_conflict use_column
BEGIN
  IF 'no_subscribers' = ANY (reasons) THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = 'outbox: dead_letter: reason no_subscribers is kept for events no queue subscribes to';
  END IF;
  IF NOT wait_for_flush THEN
    PERFORM set_config('synchronous_commit', 'off', true);
  END IF;
  RETURN QUERY
  WITH mine AS MATERIALIZED (
    SELECT d.*, t.queue AS lock_queue, t.key AS lock_key, t.head AS lock_head
    FROM unnest(ids, tokens, reasons, errors, attempted_flags, failed_flags)
      AS d(id, token, reason, error, attempted, failed)
    JOIN outbox.messages AS t ON t.id = d.id AND COALESCE(t.acquired_token, '00000000-0000-0000-0000-000000000000'::uuid) = d.token
  ), kept AS MATERIALIZED (
    -- Materialised: the lock is tried on the deliveries' own rows only, once each.
    SELECT k.*, k.lock_key IS NOT NULL AND k.lock_head AS locked FROM mine AS k
    WHERE k.lock_key IS NULL OR NOT k.lock_head
       OR pg_try_advisory_xact_lock(hashtext(k.lock_queue), hashtext(k.lock_key))
  ), gone AS (
    DELETE FROM outbox.messages AS t USING kept AS d
    WHERE t.id = d.id AND COALESCE(t.acquired_token, '00000000-0000-0000-0000-000000000000'::uuid) = d.token AND (t.key IS NULL OR NOT t.head OR d.locked)
    RETURNING t.id, t.queue, t.payload, t.headers, t.key, t.created_at, t.available_at, t.acquired_by,
              t.deliveries_count, t.attempts_count, t.failures_count, t.first_attempt_at, t.last_attempt_at,
              t.last_error, t.head, t.id::text || '/' || COALESCE(t.acquired_token, '00000000-0000-0000-0000-000000000000'::uuid)::text AS delivery,
              d.reason, d.error,
              -- Counts of one delivery: whether a handler ran and failed, nothing more.
              least(greatest(d.attempted, 0), 1) AS attempted, least(greatest(d.failed, 0), 1) AS failed
  ), moved AS (
    INSERT INTO outbox.dead_letters AS dl
      (id, queue, payload, headers, key, created_at, available_at, acquired_by, deliveries_count,
       attempts_count, failures_count, first_attempt_at, last_attempt_at, dead_at, reason, error)
    SELECT g.id, g.queue, g.payload, g.headers, g.key, g.created_at, g.available_at, g.acquired_by,
           g.deliveries_count, LEAST(g.attempts_count, 2147483646) + g.attempted,
           LEAST(g.failures_count, 2147483646) + g.failed,
           CASE WHEN g.attempted > 0 THEN COALESCE(g.first_attempt_at, now()) ELSE g.first_attempt_at END,
           CASE WHEN g.attempted > 0 THEN now() ELSE g.last_attempt_at END,
           now(), g.reason, left(COALESCE(g.error, g.last_error), max_error_length)
    FROM gone AS g
    -- A replayed message that dies again replaces its earlier dead letter instead of failing the move.
    ON CONFLICT (id) DO UPDATE SET
      queue = excluded.queue, payload = excluded.payload, headers = excluded.headers, key = excluded.key,
      created_at = excluded.created_at, available_at = excluded.available_at,
      acquired_by = excluded.acquired_by, deliveries_count = excluded.deliveries_count,
      attempts_count = excluded.attempts_count, failures_count = excluded.failures_count,
      first_attempt_at = excluded.first_attempt_at, last_attempt_at = excluded.last_attempt_at,
      dead_at = excluded.dead_at, reason = excluded.reason, error = excluded.error
  )
  -- Only when some delivery was not moved: which are still ours as heads (busy). The rows gone are still
  -- visible to this statement's snapshot, so they are excluded by id.
  SELECT CASE WHEN count(*) < cardinality(ids) THEN COALESCE(array_agg(g.delivery), '{}') END,
         CASE WHEN count(*) < cardinality(ids) THEN (
           SELECT COALESCE(array_agg(t.id::text || '/' || COALESCE(t.acquired_token, '00000000-0000-0000-0000-000000000000'::uuid)::text), '{}')
           FROM unnest(ids, tokens) AS b(id, token)
           JOIN outbox.messages AS t ON t.id = b.id AND COALESCE(t.acquired_token, '00000000-0000-0000-0000-000000000000'::uuid) = b.token
           WHERE t.key IS NOT NULL AND t.head AND t.id NOT IN (SELECT x.id FROM gone AS x)
         ) ELSE '{}' END,
         COALESCE(array_agg(g.queue) FILTER (WHERE g.key IS NOT NULL AND g.head), '{}'),
         COALESCE(array_agg(g.key) FILTER (WHERE g.key IS NOT NULL AND g.head), '{}')
  FROM gone AS g;
END
$function$;
REVOKE ALL ON FUNCTION outbox.dead_letter(bigint[],uuid[],text[],text[],integer[],integer[],integer,boolean) FROM PUBLIC;

CREATE OR REPLACE FUNCTION outbox.dead_letter_announced(ids bigint[], tokens uuid[], reasons text[], errors text[], attempted_flags integer[], failed_flags integer[], max_error_length integer, wait_for_flush boolean, announce_queues text[], announce_topics text[], channel text)
 RETURNS TABLE(keys text[], busy text[], head_queues text[], head_keys text[])
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
#variable_conflict use_column
DECLARE
  r record;
  woken text[];
BEGIN
  SELECT * INTO STRICT r FROM outbox.dead_letter(ids, tokens, reasons, errors, attempted_flags,
    failed_flags, max_error_length, wait_for_flush) AS d;
  -- The deliveries moved: every one when `keys` is null, else those it names (a lost lease or a busy head
  -- moved nothing, so announces nothing). Their dead letters are the previous statement's writes.
  WITH ev AS MATERIALIZED (
    SELECT a.queue AS target_queue, CASE WHEN a.queue IS NULL THEN a.topic END AS target_topic, dl.id,
           jsonb_build_object('id', dl.id::text, 'queue', dl.queue, 'reason', dl.reason, 'error', dl.error,
             'attempts', dl.attempts_count, 'deliveries', dl.deliveries_count, 'key', dl.key,
             'headers', dl.headers, 'failedAt', dl.dead_at)
           || CASE WHEN dl.headers ? 'outbox-topic'
                   THEN jsonb_build_object('topic', dl.headers ->> 'outbox-topic') ELSE '{}' END AS payload,
           -- The original trace travels on; the header names the event a failure of message `id`.
           jsonb_strip_nulls(jsonb_build_object('outbox-failure-of', dl.id::text,
             'traceparent', dl.headers ->> 'traceparent', 'tracestate', dl.headers ->> 'tracestate')) AS headers
    FROM unnest(ids, tokens, announce_queues, announce_topics) AS a(id, token, queue, topic)
    JOIN outbox.dead_letters AS dl ON dl.id = a.id
    WHERE (a.queue IS NOT NULL OR a.topic IS NOT NULL)
      AND (r.keys IS NULL OR a.id::text || '/' || a.token::text = ANY (r.keys))
  ), ins AS (
    INSERT INTO outbox.messages (queue, payload, headers, key)
    SELECT e.target_queue, e.payload, e.headers, NULL FROM ev AS e
    WHERE e.target_queue IS NOT NULL ORDER BY e.id
    RETURNING queue
  ), fanned AS MATERIALIZED (
    SELECT f.queue FROM (
      SELECT e.target_topic AS topic,
             jsonb_agg(jsonb_build_object('payload', e.payload, 'headers', e.headers) ORDER BY e.id) AS items
      FROM ev AS e WHERE e.target_topic IS NOT NULL GROUP BY e.target_topic ORDER BY 1
    ) AS g CROSS JOIN LATERAL outbox.fan_out(g.topic, g.items) AS f
  )
  -- Aggregated over both, so the fan-out runs whether or not anyone is woken.
  SELECT array_agg(DISTINCT w.queue) INTO woken
  FROM (SELECT i.queue FROM ins AS i UNION ALL SELECT x.queue FROM fanned AS x) AS w;
  IF channel IS NOT NULL AND woken IS NOT NULL THEN
    PERFORM pg_notify(channel, q.queue) FROM unnest(woken) AS q(queue);
  END IF;
  RETURN QUERY SELECT r.keys, r.busy, r.head_queues, r.head_keys;
END
$function$;
REVOKE ALL ON FUNCTION outbox.dead_letter_announced(bigint[],uuid[],text[],text[],integer[],integer[],integer,boolean,text[],text[],text) FROM PUBLIC;

CREATE OR REPLACE FUNCTION outbox.expand_topic()
 RETURNS trigger
 LANGUAGE plpgsql
 STABLE
AS $function$
BEGIN
  IF NEW.queue IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = format(
      'outbox: a row names both queue %s and topic %s: set one (a topic reaches every queue subscribed to it)',
      left(quote_literal(NEW.queue), 60), left(quote_literal(NEW.topic), 60));
  END IF;
  IF NEW.dedupe_key IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = format(
      'outbox: a row for topic %s sets dedupe_key: a topic takes none (each subscriber''s copy is its own message); insert a row per queue with its own dedupe_key instead',
      left(quote_literal(NEW.topic), 60));
  END IF;
  PERFORM outbox.copy_to_queues(NEW.topic, outbox.topic_queues(NEW.topic), jsonb_build_array(
    jsonb_build_object('payload', NEW.payload, 'headers', NEW.headers, 'key', NEW.key,
                       'available_at', NEW.available_at)), true);
  RETURN NULL;
END
$function$;

CREATE OR REPLACE FUNCTION outbox.expire_dead_letters(older_than_ms double precision, max_rows integer)
 RETURNS TABLE(queue text, deleted integer)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
#variable_conflict use_column
BEGIN
  RETURN QUERY
  WITH picked AS (
    SELECT x.id FROM outbox.dead_letters AS x
    WHERE x.dead_at < now() - older_than_ms * interval '1 millisecond'
    ORDER BY x.dead_at
    LIMIT max_rows
    FOR UPDATE SKIP LOCKED
  ), gone AS (
    DELETE FROM outbox.dead_letters AS d USING picked AS p WHERE d.id = p.id
    RETURNING d.queue
  )
  SELECT g.queue, count(*)::integer FROM gone AS g GROUP BY g.queue ORDER BY g.queue;
END
$function$;
REVOKE ALL ON FUNCTION outbox.expire_dead_letters(double precision,integer) FROM PUBLIC;

CREATE OR REPLACE FUNCTION outbox.expire_inbox(older_than_ms double precision, max_rows integer)
 RETURNS TABLE(queue text, deleted integer)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
#variable_conflict use_column
BEGIN
  RETURN QUERY
  WITH picked AS (
    SELECT x.consumer, x.dedupe_key FROM outbox.inbox AS x
    WHERE x.handled_at < now() - older_than_ms * interval '1 millisecond'
    ORDER BY x.handled_at
    LIMIT max_rows
    FOR UPDATE SKIP LOCKED
  ), gone AS (
    DELETE FROM outbox.inbox AS i USING picked AS p
    WHERE i.consumer = p.consumer AND i.dedupe_key = p.dedupe_key
    RETURNING i.queue
  )
  SELECT g.queue, count(*)::integer FROM gone AS g GROUP BY g.queue ORDER BY g.queue;
END
$function$;
REVOKE ALL ON FUNCTION outbox.expire_inbox(double precision,integer) FROM PUBLIC;

CREATE OR REPLACE FUNCTION outbox.fan_out(topic text, items jsonb, keep_unrouted boolean DEFAULT true)
 RETURNS TABLE(ord integer, id bigint, queue text)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
BEGIN
  RETURN QUERY
  SELECT f.ord, f.id, f.queue
  FROM outbox.copy_to_queues(topic, outbox.topic_queues(topic), items, keep_unrouted) AS f;
END
$function$;

CREATE OR REPLACE FUNCTION outbox.mark_key_head()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
  PERFORM pg_advisory_xact_lock(hashtext(NEW.queue), hashtext(NEW.key));
  NEW.head := NOT EXISTS (
    SELECT 1 FROM outbox.messages AS m WHERE m.queue = NEW.queue AND m.key = NEW.key
  );
  NEW.below_head := NOT NEW.head AND EXISTS (
    SELECT 1 FROM outbox.messages AS m
    WHERE m.queue = NEW.queue AND m.key = NEW.key AND m.id > NEW.id
  );
  RETURN NEW;
END
$function$;

CREATE OR REPLACE FUNCTION outbox.notify_inserted()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
  -- One notification per queue per statement; Postgres folds duplicates within a transaction.
  PERFORM pg_notify('outbox_wake', q.queue) FROM (SELECT DISTINCT queue FROM inserted) AS q;
  RETURN NULL;
END
$function$;

CREATE OR REPLACE FUNCTION outbox.promote_heads(queues text[], keys text[], hand_off integer, hand_token uuid, lease_ttl_ms double precision, worker_id text)
 RETURNS TABLE(id text, queue text, payload text, headers jsonb, key text, created_epoch double precision, deliveries_count integer, attempts_count integer, failures_count integer, first_attempt_at timestamp with time zone, last_attempt_at timestamp with time zone, taken boolean)
 LANGUAGE sql
AS $function$
  SELECT * FROM outbox.promote_heads_after(
    queues, keys, array_fill(0::bigint, ARRAY[cardinality(keys)]), hand_off, hand_token, lease_ttl_ms, worker_id
  )
$function$;

CREATE OR REPLACE FUNCTION outbox.promote_heads_after(queues text[], keys text[], afters bigint[], hand_off integer, hand_token uuid, lease_ttl_ms double precision, worker_id text)
 RETURNS TABLE(id text, queue text, payload text, headers jsonb, key text, created_epoch double precision, deliveries_count integer, attempts_count integer, failures_count integer, first_attempt_at timestamp with time zone, last_attempt_at timestamp with time zone, taken boolean)
 LANGUAGE plpgsql
AS $function$
#variable_conflict use_column
BEGIN
  RETURN QUERY
  WITH next AS (
    SELECT n.id, n.available_at <= now() AS due FROM unnest(queues, keys, afters) AS k(queue, key, after)
    CROSS JOIN LATERAL (
      SELECT m.id, m.available_at FROM outbox.messages AS m
      WHERE m.queue = k.queue AND m.key = k.key
        -- Above the deleted head, or from the key's lowest row marked below_head: those can sit below the
        -- head they waited behind. Whether any row is marked at all is one probe per call, of an index
        -- that is nearly always empty; only then is each key probed.
        AND m.id > CASE WHEN EXISTS (SELECT 1 FROM outbox.messages AS a WHERE a.below_head)
                        THEN LEAST(k.after, (
                          SELECT min(b.id) - 1 FROM outbox.messages AS b
                          WHERE b.queue = k.queue AND b.key = k.key AND b.below_head
                        ))
                        ELSE k.after END
      ORDER BY m.id LIMIT 1
    ) AS n
  ), ranked AS (
    SELECT x.id, x.due AND row_number() OVER (ORDER BY x.due DESC, x.id) <= hand_off AS take FROM next AS x
  )
  UPDATE outbox.messages AS t
  SET head = true,
      -- A row someone already holds (a worker of an unordered queue) keeps its lease.
      acquired_token = CASE WHEN r.take AND t.acquired_token IS NULL THEN hand_token ELSE t.acquired_token END,
      acquired_at = CASE WHEN r.take AND t.acquired_token IS NULL THEN now() ELSE t.acquired_at END,
      lease_expires_at = CASE WHEN r.take AND t.acquired_token IS NULL
                              THEN now() + lease_ttl_ms * interval '1 millisecond'
                              ELSE t.lease_expires_at END,
      acquired_by = CASE WHEN r.take AND t.acquired_token IS NULL THEN worker_id ELSE t.acquired_by END,
      -- Saturated: a count at its limit must not fail the whole ack (the worker dead-letters such a row).
      deliveries_count = LEAST(t.deliveries_count, 2147483646)
                         + CASE WHEN r.take AND t.acquired_token IS NULL THEN 1 ELSE 0 END
  FROM ranked AS r
  WHERE t.id = r.id AND (NOT t.head OR (r.take AND t.acquired_token IS NULL))
  RETURNING t.id::text, t.queue, t.payload::text, t.headers, t.key, date_part('epoch', t.created_at),
            t.deliveries_count, t.attempts_count, t.failures_count, t.first_attempt_at, t.last_attempt_at,
            t.acquired_token IS NOT DISTINCT FROM hand_token;
END
$function$;

CREATE OR REPLACE FUNCTION outbox.route_unrouted(dead_ids bigint[])
 RETURNS TABLE(dead_id bigint, id bigint, queue text)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
#variable_conflict use_column
DECLARE
  ids bigint[];
  topics text[];
  items jsonb[];
  queues text[];
  event_key text;
  copies integer;
BEGIN
  SELECT array_agg(p.id ORDER BY p.id), array_agg(p.headers ->> 'outbox-topic' ORDER BY p.id),
         array_agg(jsonb_build_object('payload', p.payload, 'headers', p.headers, 'key', p.key) ORDER BY p.id)
  INTO ids, topics, items
  FROM (
    -- In id order, so two replays over the same rows cannot deadlock on them; all before any key lock.
    SELECT x.* FROM outbox.dead_letters AS x
    WHERE x.id = ANY(dead_ids) AND x.reason = 'no_subscribers' AND x.headers ? 'outbox-topic'
    ORDER BY x.id FOR UPDATE
  ) AS p;
  IF ids IS NULL THEN
    RETURN;
  END IF;
  FOR i IN 1 .. cardinality(ids) LOOP
    queues := outbox.topic_queues(topics[i]);
    event_key := items[i] ->> 'key';
    CONTINUE WHEN cardinality(queues) = 0;
    CONTINUE WHEN event_key IS NOT NULL AND EXISTS (
      SELECT 1 FROM unnest(queues) AS q(queue)
      WHERE NOT pg_try_advisory_xact_lock(hashtext(q.queue), hashtext(event_key))
    );
    RETURN QUERY
    WITH ins AS (
      INSERT INTO outbox.messages AS m (queue, payload, headers, key, available_at)
      SELECT q.queue, items[i] -> 'payload', items[i] -> 'headers', event_key, now()
      FROM unnest(queues) WITH ORDINALITY AS q(queue, qo)
      ORDER BY q.qo
      RETURNING m.id, m.queue
    )
    SELECT ids[i], ins.id, ins.queue FROM ins ORDER BY ins.id;
    GET DIAGNOSTICS copies = ROW_COUNT;
    IF copies > 0 THEN
      DELETE FROM outbox.dead_letters AS x WHERE x.id = ids[i];
    END IF;
  END LOOP;
END
$function$;

CREATE OR REPLACE FUNCTION outbox.topic_matcher(pattern text)
 RETURNS text
 LANGUAGE plpgsql
 IMMUTABLE STRICT
AS $function$
DECLARE
  segment text;
  matcher text := '';
BEGIN
  IF octet_length(pattern) > 200 OR pattern !~ '^([*#]|[A-Za-z0-9_:/-]+)(\.([*#]|[A-Za-z0-9_:/-]+))*$' THEN
    RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = format(
      'outbox: %s is not a topic pattern: dot-separated segments of letters, digits and _ : / -, or * (one segment) or # (any number), at most 200 bytes',
      left(quote_literal(pattern), 60));
  END IF;
  FOREACH segment IN ARRAY string_to_array(pattern, '.') LOOP
    matcher := matcher || CASE segment WHEN '*' THEN '\.[^.]+' WHEN '#' THEN '(\.[^.]+)*' ELSE '\.' || segment END;
  END LOOP;
  RETURN '^' || matcher || '$';
END
$function$;

CREATE OR REPLACE FUNCTION outbox.topic_queues(topic text)
 RETURNS text[]
 LANGUAGE plpgsql
 STABLE SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
BEGIN
  RETURN (
    SELECT coalesce(array_agg(DISTINCT s.queue ORDER BY s.queue), '{}')
    FROM outbox.subscriptions AS s
    WHERE s.pattern = topic OR (s.wildcard AND '.' || topic ~ s.matcher)
  );
END
$function$;
