import type pg from "pg";
import { OutboxError } from "../contract/errors.js";
import { isPreparedStatementLost, type Query, run, runQuery, type Statement } from "../sql/executor.js";
import { NOTIFY } from "../sql/produce.js";
import { BEGIN, COMMIT, DISCARD_PLANS } from "../sql/transaction.js";

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
  /** The clock of the plan refresh (tests); the first session on a pool sets it for that pool. */
  now?: () => number;
  /**
   * Every statement runs on this connection, inside the transaction its owner holds open there (a
   * transaction-held batch, src/lease/pg-batch.ts): `transaction` adds no BEGIN or COMMIT, since the owner's
   * commit makes it all land together, and `connect` is refused (nothing may leave that transaction).
   */
  within?: pg.PoolClient;
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

/**
 * How often each connection drops the plans of its named statements. Postgres keeps the generic plan it
 * made in a statement's first executions until an ANALYZE or VACUUM of the table invalidates it; made while
 * the outbox had a page or two, that plan scans the table sequentially, and without vacuum the table grows
 * with the versions of delivered rows: every lease and ack then reads all of it (bench/RESULTS.md, issue 30:
 * pickup 1 → 13 ms in 100 s at 500 msg/s). Replanned at most this long after the table grew, for one round
 * trip per connection per period.
 */
export const PLAN_REFRESH_MS = 30_000;

/** Per connection: the refresh period it was last handed out in (absent: never handed out yet). */
const planned = new WeakMap<pg.PoolClient, number>();
/** Pools whose connections refresh their plans: one listener per pool, however many stores share it. */
const watched = new WeakSet<pg.Pool>();

/**
 * A connection handed out in a later period than before drops its plans first: the DISCARD is queued on it
 * before the statement it was taken for, so statements stay `pool.query`. On a pool the caller passed in,
 * its other users' plans are refreshed too (a replan, nothing else); behind a transaction-mode pooler it is
 * a round trip with nothing to drop.
 */
function watchPlans(p: pg.Pool, now: () => number, timeoutMs: number): void {
  if (watched.has(p) || typeof p.on !== "function") return;
  watched.add(p);
  p.on("acquire", (client: pg.PoolClient) => {
    const period = Math.floor(now() / PLAN_REFRESH_MS);
    const last = planned.get(client);
    if (last === period) return;
    planned.set(client, period);
    // A broken connection fails the statement behind it too, which its caller retries.
    if (last !== undefined) run(client, DISCARD_PLANS, [], { timeoutMs }).catch(() => {});
  });
}

export function createPgSession(options: PgSessionOptions): PgSession {
  let prepared = options.preparedStatements;
  const timeoutMs = options.queryTimeoutMs;
  const now = options.now ?? Date.now;
  function pool(): pg.Pool {
    const p = options.pool();
    watchPlans(p, now, timeoutMs);
    return p;
  }

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
    const client = await pool().connect();
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

  const session: PgSession = {
    query: async (q, p) => runNoticing(pool(), q, p),
    runnerOn: (client) => (q, p) => runNoticing(client, q, p),
    transaction,
    control: (client, statement) => run(client, statement, [], { timeoutMs }),
    // Always on the pool: in a batch's session too, a trailing wake-up may come after the batch's commit,
    // when its connection is no longer its own (statements in the write itself notify at the commit).
    notify: (channel, queue) => run(pool(), NOTIFY, [channel, queue], { timeoutMs }),
    connect: () => pool().connect(),
    useUnnamedStatements() {
      const was = prepared;
      prepared = false;
      return was;
    },
  };
  const within = options.within;
  if (!within) return session;
  const runIn: Runner = (q, p) => runNoticing(within, q, p);
  return {
    ...session,
    query: runIn,
    transaction: (work) => work(runIn),
    connect: () => Promise.reject(new OutboxError("a transaction-held batch opens no other connection")),
  };
}
