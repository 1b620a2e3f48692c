-- The promotion after a head's ack looks for the key's next row above the deleted head's id, skipping the
-- index entries of the key's deleted rows (the deleted head's own versions cannot be skipped any other way
-- inside the ack's transaction). Every row of a key is above its head, but for one published with an id
-- below a row already in its key: a replayed dead letter (it keeps its old id), or a plain-SQL producer whose
-- id was drawn before the key's lock (the trigger takes it after). The trigger marks those, and the
-- promotion looks below the head for keys that have one. Quick on a live table, as in 0003: a constant
-- default (no rewrite), the table lock held for the catalog change only, given up on after a moment.
SET LOCAL lock_timeout = '250ms';
ALTER TABLE {{schema}}.messages ADD COLUMN below_head boolean NOT NULL DEFAULT false;

-- As 0003's, and marks a row published below a row already in its key (a second probe of the key index,
-- for rows behind a head only: a head has nothing in its key at all).
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
