import type pg from "pg";
import { isPreparedStatementLost, type Query, run, runQuery, type Statement } from "../sql/executor.js";
import { NOTIFY } from "../sql/produce.js";
import { BEGIN, COMMIT } from "../sql/transaction.js";

/** Runs one statement: on the pool (its own implicit transaction), or on a handler's connection. */
export type Runner = <P, R>(q: Query<P, R>, p: P) => Promise<R[]>;

export interface PgSessionOptions {
  /** The worker's pool; a function because the pool exists only once the worker starts. */
  pool: () => pg.Pool;
  /** Start with named prepared statements; they are dropped for good on the first sign of a pooler. */
  preparedStatements: boolean;
  /** Bound on every round trip. */
  queryTimeoutMs: number;
  /** Named statements were lost between statements (a transaction-mode pooler): unnamed from now on. */
  onPreparedLost?: (error: unknown) => void;
}

/**
 * The lease store's way to the database: statements on the pool or on a connection of their own, named
 * (prepared) until a transaction-mode pooler shows it loses them, then unnamed for good.
 */
export interface PgSession {
  /** A statement on the pool. */
  query: Runner;
  /** A statement on `client`, noticing a lost named statement like `query` does. */
  runnerOn(client: pg.PoolClient): Runner;
  /**
   * One transaction on one connection: a keyed completion and the promotion of its successors commit
   * together, or neither does (a crash in between would leave the key with no head).
   */
  transaction<T>(work: (run: Runner) => Promise<T>): Promise<T>;
  /** Transaction control on `client`: never named. */
  control(client: pg.PoolClient, statement: Statement): Promise<unknown[]>;
  /** Wakes the workers of `queue` on `channel`, on the pool (never named). */
  notify(channel: string, queue: string): Promise<unknown[]>;
  connect(): Promise<pg.PoolClient>;
  /** Every statement from now on is unnamed → false when they already were. */
  useUnnamedStatements(): boolean;
}

export function createPgSession(options: PgSessionOptions): PgSession {
  let prepared = options.preparedStatements;
  const timeoutMs = options.queryTimeoutMs;

  /**
   * A transaction-mode pooler hands each statement to any server connection: named statements cannot work
   * there. The failed write is retried by its caller (the token makes a repeat harmless).
   */
  function noticeLost(error: unknown): void {
    if (prepared && isPreparedStatementLost(error)) {
      prepared = false;
      options.onPreparedLost?.(error);
    }
  }

  /**
   * Every statement is bounded by queryTimeoutMs: on a half-open socket (a black-holed network, a
   * failover) an answer never comes and nothing else would end the wait; pg then destroys the connection.
   */
  async function runNoticing<P, R>(executor: pg.Pool | pg.PoolClient, q: Query<P, R>, p: P): Promise<R[]> {
    try {
      return await runQuery(executor, q, p, { prepared, timeoutMs });
    } catch (error) {
      noticeLost(error);
      throw error;
    }
  }

  async function transaction<T>(work: (run: Runner) => Promise<T>): Promise<T> {
    const client = await options.pool().connect();
    try {
      await run(client, BEGIN, [], { timeoutMs });
      const result = await work((q, p) => runQuery(client, q, p, { prepared, timeoutMs }));
      await run(client, COMMIT, [], { timeoutMs });
      client.release();
      return result;
    } catch (error) {
      // Never hand a connection back mid-transaction (or mid-answer): destroy it, which rolls back.
      client.release(error instanceof Error ? error : new Error(String(error)));
      noticeLost(error);
      throw error;
    }
  }

  return {
    query: async (q, p) => runNoticing(options.pool(), q, p),
    runnerOn: (client) => (q, p) => runNoticing(client, q, p),
    transaction,
    control: (client, statement) => run(client, statement, [], { timeoutMs }),
    notify: (channel, queue) => run(options.pool(), NOTIFY, [channel, queue], { timeoutMs }),
    connect: () => options.pool().connect(),
    useUnnamedStatements() {
      const was = prepared;
      prepared = false;
      return was;
    },
  };
}
