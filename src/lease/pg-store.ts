import { randomUUID } from "node:crypto";
import type pg from "pg";
import { completeStatements, deliveryKey, type KeyRow } from "../sql/complete.js";
import { isPreparedStatementLost, plainArray, type Query, runQuery } from "../sql/executor.js";
import { fetchStatement } from "../sql/fetch.js";
import type { OutboxNames } from "../sql/names.js";
import {
  type AckWrite,
  allLanded,
  type DeadWrite,
  type Delivery,
  type Landed,
  type LeaseStore,
  landedByKey,
  type RetryWrite,
} from "./store.js";

export interface PgLeaseStoreOptions {
  /** The worker's pool; a function because the pool exists only once the worker starts. */
  pool: () => pg.Pool;
  names: OutboxNames;
  queues: readonly string[];
  workerId: string;
  leaseTtlMs: number;
  maxErrorLength: number;
  /** false: the worker's writes skip the WAL flush wait (a server crash can only redeliver). */
  synchronousCommit: boolean;
  /** Start with named prepared statements; they are dropped for good on the first sign of a pooler. */
  preparedStatements: boolean;
  /** Bound on every round trip. */
  queryTimeoutMs: number;
  /** Named statements were lost between statements (a transaction-mode pooler): unnamed from now on. */
  onPreparedLost?: (error: unknown) => void;
}

const key = (d: Delivery) => deliveryKey(d.id, d.token);

/** The lease store on Postgres: the fetch statement and the token-guarded writes of src/sql. */
export function createPgLeaseStore(options: PgLeaseStoreOptions): LeaseStore {
  const settings = { synchronousCommit: options.synchronousCommit };
  const leaseSql = fetchStatement(options.names, settings);
  const sql = completeStatements(options.names, settings);
  const queues = [...options.queues];
  let prepared = options.preparedStatements;

  /**
   * Every statement is bounded by queryTimeoutMs: on a half-open socket (a black-holed network, a
   * failover) an answer never comes and nothing else would end the wait; pg then destroys the connection.
   */
  async function query<Params, Row>(statement: Query<Params, Row>, params: Params): Promise<Row[]> {
    try {
      return await runQuery(options.pool(), statement, params, {
        prepared,
        timeoutMs: options.queryTimeoutMs,
      });
    } catch (error) {
      if (prepared && isPreparedStatementLost(error)) {
        // A transaction-mode pooler hands each statement to any server connection: named statements
        // cannot work there. The failed write is retried by its caller (the token makes a repeat harmless).
        prepared = false;
        options.onPreparedLost?.(error);
      }
      throw error;
    }
  }

  // Ids come back from the fetch as decimal text and tokens are our own UUIDs: both are safe unquoted.
  const pairs = (ds: readonly Delivery[]) => ({
    ids: plainArray(ds.map((d) => d.id)),
    tokens: plainArray(ds.map((d) => d.token)),
  });
  const landed = (rows: KeyRow[]) => landedByKey(new Set(rows.map((r) => r.key)), key);
  const held = <W extends { held: Delivery }>(writes: readonly W[]) => writes.map((w) => w.held);

  return {
    async lease(limit) {
      const token = randomUUID();
      const rows = await query(leaseSql, {
        queues,
        limit,
        token,
        leaseTtlMs: options.leaseTtlMs,
        workerId: options.workerId,
      });
      return { token, rows };
    },

    async ack(writes: readonly AckWrite[]): Promise<Landed> {
      const [result] = await query(sql.ack, pairs(held(writes)));
      // The statement names the deleted deliveries only when some were not deleted.
      return result?.keys ? landedByKey(new Set(result.keys), key) : allLanded(writes.length);
    },

    async retry(writes: readonly RetryWrite[]) {
      return landed(
        await query(sql.retry, {
          ...pairs(held(writes)),
          delaysMs: writes.map((w) => w.delayMs),
          errors: writes.map((w) => w.error),
          failed: writes.map((w) => w.failed),
          maxErrorLength: options.maxErrorLength,
        }),
      );
    },

    async deadLetter(writes: readonly DeadWrite[]) {
      return landed(
        await query(sql.dead, {
          ...pairs(held(writes)),
          reasons: writes.map((w) => w.reason),
          errors: writes.map((w) => w.error),
          attempted: writes.map((w) => w.attempted),
          failed: writes.map((w) => w.failed),
          maxErrorLength: options.maxErrorLength,
        }),
      );
    },

    async release(deliveries) {
      return landed(await query(sql.release, pairs(deliveries)));
    },

    async whereabouts(deliveries) {
      return (await query(sql.whereabouts, pairs(deliveries))).map((r) => r.fate);
    },

    async renew(deliveries) {
      return landed(await query(sql.renew, { ...pairs(deliveries), leaseTtlMs: options.leaseTtlMs }));
    },
  };
}
