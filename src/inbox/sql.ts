/** The quoted names of one inbox table (schema and table already validated as plain identifiers). */
export interface InboxNames {
  readonly schema: string;
  readonly table: string;
  /** `"schema"."table"`. */
  readonly qualified: string;
  readonly receivedIndex: string;
}

export function inboxNames(schema: string, table: string): InboxNames {
  return {
    schema,
    table,
    qualified: `"${schema}"."${table}"`,
    receivedIndex: `"${table}_consumer_received_at"`,
  };
}

/**
 * The inbox's DDL, idempotent: one row per (consumer, source, event id) handled. `source` is in the key
 * because CloudEvents ids are unique per source only: two outboxes both send an event `1`, and neither may
 * pass for the other's duplicate. The index on (consumer, received_at) serves the retention's batches.
 */
export function installSql(names: InboxNames): string {
  const schema = names.schema === "public" ? "" : `CREATE SCHEMA IF NOT EXISTS "${names.schema}";\n`;
  return `${schema}CREATE TABLE IF NOT EXISTS ${names.qualified} (
  consumer text NOT NULL,
  source text NOT NULL,
  event_id text NOT NULL,
  received_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (consumer, source, event_id)
);
CREATE INDEX IF NOT EXISTS ${names.receivedIndex} ON ${names.qualified} (consumer, received_at);
`;
}

/**
 * The record of one event, inside the handler's transaction: one row back when it is new, none when the
 * key is there. A concurrent delivery of the same event that inserted first and has not committed makes
 * this wait on its unique-index entry, then (after its commit) see the conflict: never both handlers.
 */
export function insertRecordSql(names: InboxNames): string {
  return `INSERT INTO ${names.qualified} (consumer, source, event_id) VALUES ($1, $2, $3)
ON CONFLICT DO NOTHING RETURNING 1`;
}

/**
 * One retention batch: at most $3 records of consumer $1 older than $2 ms (server clock), oldest first
 * through the (consumer, received_at) index. SKIP LOCKED: a record a running handler just wrote (or another
 * replica's batch holds) is left, never waited for.
 */
export function expireBatchSql(names: InboxNames): string {
  return `DELETE FROM ${names.qualified} WHERE ctid = ANY (ARRAY(
  SELECT ctid FROM ${names.qualified}
  WHERE consumer = $1 AND received_at < now() - $2::double precision * interval '1 millisecond'
  ORDER BY received_at LIMIT $3 FOR UPDATE SKIP LOCKED))`;
}
