-- Function files of one version: the checksums a later build of the same release replaced, so that two
-- builds migrating one schema in turn (a release candidate and its release count as two versions since
-- this change; two builds of one version string, e.g. a branch and main, are the same version) never put
-- each other's bodies back on every migrate. A body once replaced under its version stays replaced; a newer
-- version starts the list afresh. A catalog change on a table only the migrator writes: no lock on messages.
ALTER TABLE {{schema}}.schema_functions ADD COLUMN replaced_checksums text[] NOT NULL DEFAULT '{}';
