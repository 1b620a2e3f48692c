import { OutboxConfigError } from "../contract/errors.js";

/** The outbox schema every function uses when none is given. */
export const DEFAULT_SCHEMA = "outbox";

// Postgres truncates identifiers to 63 bytes (NAMEDATALEN - 1); a longer derived name would silently
// collide with another, so every name we derive from the schema must fit.
const MAX_IDENTIFIER_BYTES = 63;
const CHANNEL_SUFFIX = "_wake";

/**
 * Why each character is banned: only lower-case letters, digits and `_` keep the name the same whether it is
 * quoted or not (Postgres folds unquoted names to lower case, so `MyOutbox` in a user's query would miss a
 * schema created as "MyOutbox"); quotes, semicolons, spaces and dashes are what injected SQL is made of;
 * `$` and non-ASCII letters are legal in Postgres but not in standard SQL and in few tools.
 */
const PLAIN_IDENTIFIER = /^[a-z_][a-z0-9_]*$/;

/** The names one outbox schema uses, all derived from a validated schema name. */
export interface OutboxNames {
  readonly schema: string;
  /** The quoted schema, safe to splice into SQL text. */
  readonly quotedSchema: string;
  /** `LISTEN`/`pg_notify` channel that wakes workers; the payload is a queue name. */
  readonly channel: string;
  readonly messages: string;
  readonly deadLetters: string;
  /** Which queues receive which topics (migration 0012). */
  readonly subscriptions: string;
  readonly unprocessed: string;
  /** The leased rows without their tokens, for `status` (migration 0015). */
  readonly leases: string;
  /**
   * The rows transaction-held batches (leaseMode "transaction") hold now, with their worker: a function call
   * to read FROM like a table (`batch_leased()`, migration 0024).
   */
  readonly batchLeased: string;
  /** The worker inbox: which (consumer, dedupe key) was handled (migration 0016). */
  readonly inbox: string;
  readonly migrationsTable: string;
}

/**
 * Returns `schema` if it can name an outbox schema, else throws {@link OutboxConfigError} naming `field`:
 * lower-case letters, digits and `_` only, not `pg_*` or a system schema, short enough for the names derived
 * from it. Every function taking a schema checks it this way before any SQL runs.
 */
export function validateSchemaName(schema: unknown, field = "schema"): string {
  if (typeof schema !== "string" || schema.length === 0) {
    throw new OutboxConfigError(field, "must be a non-empty string");
  }
  if (!PLAIN_IDENTIFIER.test(schema)) {
    throw new OutboxConfigError(
      field,
      `${JSON.stringify(schema)} is not a plain identifier: use lower-case letters, digits and "_", starting with a letter or "_"`,
    );
  }
  if (schema.startsWith("pg_")) {
    throw new OutboxConfigError(field, `"${schema}": names starting with "pg_" are reserved by Postgres`);
  }
  if (schema === "information_schema") {
    throw new OutboxConfigError(field, `"${schema}" is a system schema`);
  }
  const longest = schema + CHANNEL_SUFFIX;
  if (Buffer.byteLength(longest) > MAX_IDENTIFIER_BYTES) {
    throw new OutboxConfigError(
      field,
      `"${schema}" is too long: the derived channel name "${longest}" must fit in ${MAX_IDENTIFIER_BYTES} bytes (schema at most ${MAX_IDENTIFIER_BYTES - CHANNEL_SUFFIX.length})`,
    );
  }
  return schema;
}

/**
 * The quoted table, view and channel names of an outbox schema, for your own SQL against it (e.g. a
 * plain-SQL producer inserting into `messages`). Throws {@link OutboxConfigError} on an invalid schema name.
 */
export function outboxNames(schema: string = DEFAULT_SCHEMA): OutboxNames {
  const valid = validateSchemaName(schema);
  const quotedSchema = `"${valid}"`;
  return {
    schema: valid,
    quotedSchema,
    channel: `${valid}${CHANNEL_SUFFIX}`,
    messages: `${quotedSchema}.messages`,
    deadLetters: `${quotedSchema}.dead_letters`,
    subscriptions: `${quotedSchema}.subscriptions`,
    unprocessed: `${quotedSchema}.unprocessed`,
    leases: `${quotedSchema}.leases`,
    batchLeased: `${quotedSchema}.batch_leased()`,
    inbox: `${quotedSchema}.inbox`,
    migrationsTable: `${quotedSchema}.schema_migrations`,
  };
}

/** Quote a string as an SQL literal (for the few places a value must be spliced into DDL). */
export function quoteLiteral(value: string): string {
  return `'${value.replaceAll("'", "''")}'`;
}
