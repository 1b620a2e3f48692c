-- Function files: from here on the live definition of each of the schema's functions is one file,
-- migrations/functions/<name>.sql, which the migrator (re)applies after the numbered migrations whenever its
-- checksum differs from the one recorded here (CREATE OR REPLACE, in a transaction of its own, keeping the
-- function's owner and grants). The numbered migrations before this one keep the bodies they had, as history.
-- package_version: the release that applied it, so an older release migrating the same schema keeps a newer
-- body instead of putting its own back (function bodies stay callable by the previous release's code).
CREATE TABLE {{schema}}.schema_functions (
  name            text        PRIMARY KEY,
  checksum        text        NOT NULL,
  package_version text        NOT NULL,
  applied_at      timestamptz NOT NULL DEFAULT now()
);
