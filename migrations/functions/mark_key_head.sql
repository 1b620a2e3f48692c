-- mark_key_head: its live definition, (re)applied by the migrator whenever this file changes (see
-- docs/contributing/migrations.md). Change the body here, never in a numbered migration.
--
-- The key-head trigger's function, for keyed rows only. The advisory lock on (queue, key) is held until the
-- producer commits: producers of one key are serialised (ids follow commit order when the lock is taken
-- before the id, as `publish` does), and a completion that removes the key's head takes the same lock, so
-- a row marked "not head" here can never miss its promotion. A volatile function's query takes a fresh
-- snapshot: it sees the rows of the producer that held the lock. It also marks a row published below a row
-- already in its key (a replayed dead letter, or a plain-SQL producer whose id was drawn before the lock):
-- a second probe of the key index, for rows behind a head only.
CREATE OR REPLACE FUNCTION {{schema}}.mark_key_head() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_advisory_xact_lock(hashtext(NEW.queue), hashtext(NEW.key));
  NEW.head := NOT EXISTS (
    SELECT 1 FROM {{schema}}.messages AS m WHERE m.queue = NEW.queue AND m.key = NEW.key
  );
  NEW.below_head := NOT NEW.head AND EXISTS (
    SELECT 1 FROM {{schema}}.messages AS m
    WHERE m.queue = NEW.queue AND m.key = NEW.key AND m.id > NEW.id
  );
  RETURN NEW;
END
$$;
