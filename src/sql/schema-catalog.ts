/**
 * Catalog queries that describe one schema the way a freshly migrated database has it (schema.sql, the drift
 * test): every query takes the schema's name as $1 and reads through the server's own deparsers
 * (format_type, pg_get_expr, pg_get_constraintdef, pg_get_indexdef, pg_get_viewdef, pg_get_functiondef,
 * pg_get_triggerdef), so the text is what Postgres would run, not a rendering of ours. Rows come sorted, so
 * the dump is stable however the catalog stores them.
 */
export const schemaCatalog = {
  /** Tables and partitioned tables, with their storage options (fillfactor, autovacuum_*). */
  tables: `SELECT c.oid::int AS oid, c.relname AS name, coalesce(c.reloptions, '{}') AS options,
  c.relacl::text[] AS acl, pg_get_userbyid(c.relowner) AS owner
FROM pg_catalog.pg_class AS c
WHERE c.relnamespace = $1::regnamespace AND c.relkind IN ('r', 'p')
ORDER BY c.relname`,

  /** Columns in their table's order (attnum: an upgraded table keeps the order its migrations gave it). */
  columns: `SELECT a.attrelid::int AS table_oid, a.attname AS name,
  pg_catalog.format_type(a.atttypid, a.atttypmod) AS type, a.attnotnull AS not_null,
  a.attidentity AS identity, a.attgenerated AS generated,
  pg_catalog.pg_get_expr(d.adbin, d.adrelid) AS default_expr,
  CASE WHEN a.attcollation <> t.typcollation THEN co.collname END AS collation,
  a.attacl::text[] AS acl
FROM pg_catalog.pg_attribute AS a
JOIN pg_catalog.pg_class AS c ON c.oid = a.attrelid
JOIN pg_catalog.pg_type AS t ON t.oid = a.atttypid
LEFT JOIN pg_catalog.pg_attrdef AS d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
LEFT JOIN pg_catalog.pg_collation AS co ON co.oid = a.attcollation
WHERE c.relnamespace = $1::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm') AND a.attnum > 0
  AND NOT a.attisdropped
ORDER BY c.relname, a.attnum`,

  /**
   * Table constraints. Not the NOT NULL ones Postgres 18 also lists here (contype 'n', named by the server):
   * the column says NOT NULL, as on 15.
   */
  constraints: `SELECT c.relname AS table_name, k.conname AS name,
  pg_catalog.pg_get_constraintdef(k.oid, true) AS definition
FROM pg_catalog.pg_constraint AS k
JOIN pg_catalog.pg_class AS c ON c.oid = k.conrelid
WHERE c.relnamespace = $1::regnamespace AND k.contype <> 'n'
ORDER BY c.relname, k.conname`,

  /** Indexes that no constraint owns (a primary key's index is its constraint), and whether each is valid. */
  indexes: `SELECT c.relname AS table_name, i.relname AS name, pg_catalog.pg_get_indexdef(x.indexrelid) AS definition,
  x.indisvalid AS valid, coalesce(i.reloptions, '{}') AS options
FROM pg_catalog.pg_index AS x
JOIN pg_catalog.pg_class AS i ON i.oid = x.indexrelid
JOIN pg_catalog.pg_class AS c ON c.oid = x.indrelid
WHERE c.relnamespace = $1::regnamespace
  AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_constraint AS k WHERE k.conindid = x.indexrelid)
ORDER BY c.relname, i.relname`,

  /** Sequences of their own; those behind identity columns are the column's (GENERATED … AS IDENTITY). */
  sequences: `SELECT c.relname AS name, pg_catalog.format_type(s.seqtypid, NULL) AS type, s.seqstart::text AS start,
  s.seqincrement::text AS increment, s.seqmin::text AS min, s.seqmax::text AS max, s.seqcache::text AS cache,
  s.seqcycle AS cycle, c.relacl::text[] AS acl, pg_get_userbyid(c.relowner) AS owner
FROM pg_catalog.pg_class AS c
JOIN pg_catalog.pg_sequence AS s ON s.seqrelid = c.oid
WHERE c.relnamespace = $1::regnamespace AND c.relkind = 'S'
  AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_depend AS d
                  WHERE d.classid = 'pg_catalog.pg_class'::regclass AND d.objid = c.oid AND d.deptype = 'i')
ORDER BY c.relname`,

  views: `SELECT c.relname AS name, c.relkind = 'm' AS materialized, pg_catalog.pg_get_viewdef(c.oid, true) AS definition,
  coalesce(c.reloptions, '{}') AS options, c.relacl::text[] AS acl, pg_get_userbyid(c.relowner) AS owner
FROM pg_catalog.pg_class AS c
WHERE c.relnamespace = $1::regnamespace AND c.relkind IN ('v', 'm')
ORDER BY c.relname`,

  /** Functions and procedures (not aggregates), by name then signature. */
  functions: `SELECT p.proname AS name, p.oid::regprocedure::text AS signature,
  pg_catalog.pg_get_functiondef(p.oid) AS definition, p.proacl::text[] AS acl,
  pg_get_userbyid(p.proowner) AS owner
FROM pg_catalog.pg_proc AS p
WHERE p.pronamespace = $1::regnamespace AND p.prokind IN ('f', 'p')
ORDER BY p.proname, p.oid::regprocedure::text`,

  triggers: `SELECT c.relname AS table_name, t.tgname AS name, pg_catalog.pg_get_triggerdef(t.oid, true) AS definition,
  t.tgenabled AS enabled
FROM pg_catalog.pg_trigger AS t
JOIN pg_catalog.pg_class AS c ON c.oid = t.tgrelid
WHERE c.relnamespace = $1::regnamespace AND NOT t.tgisinternal
ORDER BY c.relname, t.tgname`,

  /** COMMENT ON the schema's relations, their columns and its functions. */
  comments: `SELECT CASE WHEN d.classoid = 'pg_catalog.pg_proc'::regclass THEN 'FUNCTION'
                 WHEN d.objsubid <> 0 THEN 'COLUMN'
                 WHEN c.relkind IN ('v', 'm') THEN 'VIEW'
                 WHEN c.relkind = 'S' THEN 'SEQUENCE'
                 WHEN c.relkind = 'i' THEN 'INDEX'
                 ELSE 'TABLE' END AS kind,
  CASE WHEN d.classoid = 'pg_catalog.pg_proc'::regclass THEN d.objoid::regprocedure::text
       WHEN d.objsubid <> 0 THEN d.objoid::regclass::text || '.' || quote_ident(a.attname)
       ELSE d.objoid::regclass::text END AS target,
  d.description
FROM pg_catalog.pg_description AS d
LEFT JOIN pg_catalog.pg_class AS c ON d.classoid = 'pg_catalog.pg_class'::regclass AND c.oid = d.objoid
LEFT JOIN pg_catalog.pg_attribute AS a ON a.attrelid = c.oid AND a.attnum = d.objsubid AND d.objsubid <> 0
LEFT JOIN pg_catalog.pg_proc AS p ON d.classoid = 'pg_catalog.pg_proc'::regclass AND p.oid = d.objoid
WHERE coalesce(c.relnamespace, p.pronamespace) = $1::regnamespace
ORDER BY 1, 2`,

  /** $1 an aclitem[] as text, $2 its object's owner → who holds what in it (the owner's own entry left out). */
  aclEntries: `SELECT CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE a.grantee::regrole::text END AS grantee,
  string_agg(a.privilege_type, ', ' ORDER BY a.privilege_type) AS privileges
FROM aclexplode($1::text[]::aclitem[]) AS a
WHERE a.grantee = 0 OR pg_get_userbyid(a.grantee) <> $2
GROUP BY 1
ORDER BY 1`,

  schemaAcl: `SELECT n.nspacl::text[] AS acl, pg_get_userbyid(n.nspowner) AS owner
FROM pg_catalog.pg_namespace AS n WHERE n.nspname = $1`,
} as const;
