-- Crash loops isolate their culprit (issue 41): a guard records whether its batch ran alone (one row held
-- through a crash, leased by a worker holding nothing else) or the worker knows the one row that ran in it.
-- Each crash of such a batch charges its row; crashed batches of several rows charge each of their rows once
-- in all (which one crashed them is unknown) and leave them to run alone. A new column of a small
-- table, with a constant default: a catalog change only, no lock on messages. Workers of the release before
-- insert guards without it (false: never charged alone).
SET LOCAL lock_timeout = '250ms';
ALTER TABLE {{schema}}.lease_guards ADD COLUMN alone boolean NOT NULL DEFAULT false;
-- The roles that write guards (a worker granted before) may write the new column too, until `grant` runs.
DO $$
DECLARE r regrole;
BEGIN
  FOR r IN
    SELECT DISTINCT a.grantee::regrole FROM pg_attribute AS t, aclexplode(t.attacl) AS a
    WHERE t.attrelid = '{{schema}}.lease_guards'::regclass AND t.attname = 'ids'
      AND a.privilege_type = 'INSERT' AND a.grantee <> 0
  LOOP
    EXECUTE format('GRANT INSERT (alone), UPDATE (alone) ON {{schema}}.lease_guards TO %s', r);
  END LOOP;
END
$$;
