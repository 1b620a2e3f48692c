-- topic_matcher: its live definition, (re)applied by the migrator whenever this file changes (see
-- docs/contributing/migrations.md). Change the body here, never in a numbered migration.
--
-- The regular expression that `'.' || topic` must match for a pattern; raises for a malformed pattern (a
-- CHECK through it names the problem). Segment characters are never special in a regular expression.
CREATE OR REPLACE FUNCTION {{schema}}.topic_matcher(pattern text) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT AS $$
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
$$;
