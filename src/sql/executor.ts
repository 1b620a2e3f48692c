import { CompiledQuery } from "kysely";

/** Anything with pg's `query(config)`: a `pg.Client`, a `PoolClient` or a `Pool`. */
export interface PgQueryable {
  query(config: { text: string; values?: unknown[]; name?: string }): Promise<{ rows: unknown[] }>;
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

export async function run<Row>(executor: Executor, statement: Statement, values: unknown[]): Promise<Row[]> {
  if (isKysely(executor)) {
    const result = await executor.executeQuery(CompiledQuery.raw(statement.text, values));
    return result.rows as Row[];
  }
  const result = await executor.query({ name: statement.name, text: statement.text, values });
  return result.rows as Row[];
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
