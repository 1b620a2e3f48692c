import { CompiledQuery } from "kysely";

/** Anything with pg's `query(config)`: a `pg.Client`, a `PoolClient` or a `Pool`. */
export interface PgQueryable {
  query(config: {
    text: string;
    values?: unknown[];
    name?: string;
    query_timeout?: number;
  }): Promise<{ rows: unknown[] }>;
}

/** A Kysely instance or transaction; only `executeQuery` is used, so any dialect-free Kysely works. */
export interface KyselyExecutor {
  executeQuery<R>(query: CompiledQuery<R>): Promise<{ rows: R[] }>;
}

/** Where a statement runs: the caller's transaction (Kysely or pg), or one of our own connections. */
export type Executor = PgQueryable | KyselyExecutor;

export interface Statement {
  /** Stable per text, so pg can keep it prepared on a connection. */
  readonly name: string;
  readonly text: string;
}

function isKysely(executor: Executor): executor is KyselyExecutor {
  return typeof (executor as Partial<KyselyExecutor>).executeQuery === "function";
}

export function isExecutor(value: unknown): value is Executor {
  if (value === null || typeof value !== "object") return false;
  const v = value as Record<string, unknown>;
  return typeof v.executeQuery === "function" || typeof v.query === "function";
}

export interface RunOptions {
  /**
   * Run as a named prepared statement, kept by pg on its connection (parsed and planned once). Off, the
   * statement is unnamed: parsed and planned every time, but it works on any connection, including one
   * behind a transaction-mode pooler (PgBouncer), where a named statement prepared on one server
   * connection is missing on the next ("prepared statement … does not exist" / "already exists").
   */
  prepared?: boolean;
  /**
   * Fail the round trip after this long (pg's query_timeout). pg then destroys the connection instead of
   * returning it to the pool: on a half-open socket the answer may never come, and nothing else would end it.
   */
  timeoutMs?: number;
}

export async function run<Row>(
  executor: Executor,
  statement: Statement,
  values: unknown[],
  options: RunOptions = {},
): Promise<Row[]> {
  if (isKysely(executor)) {
    const result = await executor.executeQuery(CompiledQuery.raw(statement.text, values));
    return result.rows as Row[];
  }
  const result = await executor.query({
    name: options.prepared ? statement.name : undefined,
    text: statement.text,
    values,
    query_timeout: options.timeoutMs,
  });
  return result.rows as Row[];
}

/** SQLSTATEs that say named prepared statements do not survive on this connection: a transaction pooler. */
const POOLER_STATEMENT_ERRORS: ReadonlySet<string> = new Set([
  "26000", // invalid_sql_statement_name: prepared statement "…" does not exist
  "42P05", // duplicate_prepared_statement: prepared statement "…" already exists
]);

export function isPreparedStatementLost(error: unknown): boolean {
  const code = (error as { code?: unknown } | null)?.code;
  return typeof code === "string" && POOLER_STATEMENT_ERRORS.has(code);
}

/**
 * A statement with its parameters as a typed object and its row type. The `$n` order is written once, in
 * `values`, beside the text: callers pass named fields, so a reordered parameter is a type error.
 */
export interface Query<Params, Row> {
  readonly statement: Statement;
  values(params: Params): unknown[];
  /** Type-only: the row type of the result. */
  readonly row?: Row;
}

/** The parameters of a statement that takes none: run it with `{}`. */
export type NoParams = Record<string, never>;

export function defineQuery<Params, Row>(
  label: string,
  text: string,
  values: (params: Params) => unknown[],
): Query<Params, Row> {
  return { statement: statement(label, text), values };
}

/** Run a {@link Query} with its parameters. */
export function runQuery<Params, Row>(
  executor: Executor,
  query: Query<Params, Row>,
  params: Params,
  options: RunOptions = {},
): Promise<Row[]> {
  return run<Row>(executor, query.statement, query.values(params), options);
}

/** Name a statement by a short hash of its text: the same text always gets the same prepared name. */
export function statement(label: string, text: string): Statement {
  let hash = 0x811c9dc5;
  for (let i = 0; i < text.length; i++) {
    hash ^= text.charCodeAt(i);
    hash = Math.imul(hash, 0x01000193) >>> 0;
  }
  return { name: `outbox_${label}_${hash.toString(36)}`, text };
}

/**
 * A Postgres array literal from values that need no quoting (decimal ids, UUIDs): pg then sends one string
 * instead of escaping every element, which costs per message at tens of thousands of rows a second.
 * Only for values this library produced; anything else goes through pg's own array encoding.
 */
export function plainArray(values: readonly string[]): string {
  return `{${values.join(",")}}`;
}

/**
 * A Postgres array literal of any texts (queue names, keys), each element double-quoted with its `"` and
 * `\` escaped, null as NULL: what pg's own array encoding sends, without its per-element work.
 */
export function textArray(values: readonly (string | null)[]): string {
  let out = "{";
  for (let i = 0; i < values.length; i++) {
    const v = values[i];
    if (i > 0) out += ",";
    if (v === null || v === undefined) out += "NULL";
    else out += `"${v.includes('"') || v.includes("\\") ? v.replace(/["\\]/g, "\\$&") : v}"`;
  }
  return `${out}}`;
}
