import { randomUUID } from "node:crypto";
import type pg from "pg";
import type { FailureAnnouncement } from "../contract/handler.js";
import { completeStatements } from "../sql/complete.js";
import { plainArray } from "../sql/executor.js";
import { aloneStatement, fetchStatement, suspectsWaitingStatement } from "../sql/fetch.js";
import type { OutboxNames } from "../sql/names.js";
import { reclaimStatement } from "../sql/own-leases.js";
import { completeKeyed } from "./pg-busy-retries.js";
import { createDeadMove } from "./pg-dead-letters.js";
import { createFollowUps, insertingFollowUps } from "./pg-follow-ups.js";
import { handlerTransactions } from "./pg-handler-transaction.js";
import { createKeyedRounds } from "./pg-keyed-rounds.js";
import { byId, held, key, landed, pairs } from "./pg-params.js";
import { createPgSession } from "./pg-session.js";
import { QueueShares } from "./queue-shares.js";
import {
  type AckWrite,
  allLanded,
  type DeadWrite,
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
  /** Queues (among `queues`) whose keys are plain metadata: no per-key ordering. */
  unorderedQueues?: readonly string[];
  workerId: string;
  leaseTtlMs: number;
  maxErrorLength: number;
  /** false: the worker's writes skip the WAL flush wait (a server crash can only redeliver). */
  synchronousCommit: boolean;
  /** Start with named prepared statements; they are dropped for good on the first sign of a pooler. */
  preparedStatements: boolean;
  /** Bound on every round trip. */
  queryTimeoutMs: number;
  /** Queues whose dead-letter moves also publish a failure event, and where to (migration 0018). */
  announceFailures?: ReadonlyMap<string, FailureAnnouncement>;
  /** A keyed completion made rows the heads of their keys: they can be leased now. */
  onPromoted?: (rows: number) => void;
  /** Some key heads could not be completed yet: a producer of their key is in flight (retried shortly). */
  onKeyBusy?: (heads: number) => void;
  /** Named statements were lost between statements (a transaction-mode pooler): unnamed from now on. */
  onPreparedLost?: (error: unknown) => void;
  /** The clock of the connections' plan refresh (tests; see PLAN_REFRESH_MS). */
  now?: () => number;
  /** Every write on this connection, in the transaction its owner holds open (see PgSessionOptions.within). */
  within?: pg.PoolClient;
}

/** The Postgres lease store, which can also be told to stop naming its statements. */
export interface PgLeaseStore extends LeaseStore {
  /**
   * Every statement from now on is unnamed: a transaction-mode pooler was found before any failed.
   * False when they already were (the option, or a lost statement seen earlier).
   */
  useUnnamedStatements(): boolean;
}

/**
 * The lease store on Postgres: the fetch statement and the token-guarded writes of src/sql. This is the
 * facade; the session (prepared statements and their fallback), the keyed rounds and their busy retries,
 * the follow-ups and handlers' transactions are modules of their own beside it.
 */
export function createPgLeaseStore(options: PgLeaseStoreOptions): PgLeaseStore {
  const settings = { synchronousCommit: options.synchronousCommit };
  const leaseSql = fetchStatement(options.names, settings, options.queues.length === 1);
  const aloneSql = aloneStatement(options.names, settings);
  const suspectsSql = suspectsWaitingStatement(options.names);
  const sql = completeStatements(options.names, settings);
  const reclaimSql = reclaimStatement(options.names, settings);
  const queues = [...options.queues];
  const unorderedQueues = [...(options.unorderedQueues ?? [])];
  const shares = new QueueShares(queues);
  const session = createPgSession(options);
  const { query } = session;
  const followUps = createFollowUps(session, options.names.channel, options.queryTimeoutMs);
  const deadMove = createDeadMove({ ...options, sql, channel: options.names.channel });
  const rounds = createKeyedRounds({
    sql,
    session,
    followUps,
    deadMove,
    unordered: new Set(unorderedQueues),
  });

  return {
    begin: handlerTransactions({ ...options, sql, session, followUps, rounds }),

    useUnnamedStatements: session.useUnnamedStatements,

    async leaseAlone(keep = []) {
      const token = randomUUID();
      const rows = await query(aloneSql, {
        queues,
        unorderedQueues,
        keep,
        token,
        leaseTtlMs: options.leaseTtlMs,
        workerId: options.workerId,
      });
      return { token, rows };
    },

    async suspectsWaiting(keep = []) {
      const [row] = await query(suspectsSql, { queues, unorderedQueues, keep });
      return row?.waiting === true;
    },

    async lease(limit, maxBytes) {
      const token = randomUUID();
      const split = shares.split(limit);
      const rows = await query(leaseSql, {
        queues,
        unorderedQueues,
        limit,
        maxBytes,
        token,
        leaseTtlMs: options.leaseTtlMs,
        workerId: options.workerId,
        shares: split,
      });
      const counts = new Map<string, number>();
      for (const row of rows) counts.set(row.queue, (counts.get(row.queue) ?? 0) + 1);
      return { token, rows, more: shares.record(limit, split, counts) };
    },

    async ack(unsorted: readonly AckWrite[], handOff = 0): Promise<Landed> {
      const writes = byId(unsorted);
      // Batches without follow-ups (nearly all) keep the plain statements: the follow-up ones cost more.
      const follows = writes.some((w) => w.followUps !== undefined && w.followUps.length > 0);
      if (writes.some((w) => w.held.key !== null))
        return completeKeyed(options, writes, handOff, (ws, h) =>
          follows ? rounds.ackFollowUps(ws, h) : rounds.ack(ws, h),
        );
      if (follows && writes.some((w) => w.followUps?.some((f) => f.key !== null)))
        return completeKeyed(options, writes, 0, (ws) => rounds.ackFollowUpKeys(ws));
      const follow = follows ? followUps.params(writes) : undefined;
      const [result] = follow
        ? await insertingFollowUps(() => query(sql.ackFollowUps, { ...pairs(held(writes)), ...follow }))
        : await query(sql.ack, pairs(held(writes)));
      // The statement names the deleted deliveries only when some were not deleted.
      return result?.keys ? landedByKey(new Set(result.keys), key) : allLanded(writes.length);
    },

    async retry(unsorted: readonly RetryWrite[]) {
      const writes = byId(unsorted);
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

    async deadLetter(unsorted: readonly DeadWrite[], handOff = 0) {
      const writes = byId(unsorted);
      if (writes.some((w) => w.held.key !== null))
        return completeKeyed(options, writes, handOff, rounds.dead);
      const [row] = await deadMove((q, p) => query(q, p), writes, false);
      // Null keys: every delivery was moved.
      return row?.keys ? landedByKey(new Set(row.keys), key) : allLanded(writes.length);
    },

    async release(deliveries) {
      return landed(await query(sql.release, pairs(byId(deliveries))));
    },

    async whereabouts(deliveries) {
      return (await query(sql.whereabouts, pairs(deliveries))).map((r) => r.fate);
    },

    async renew(deliveries) {
      return landed(await query(sql.renew, { ...pairs(byId(deliveries)), leaseTtlMs: options.leaseTtlMs }));
    },

    async reclaim(tokens, held) {
      if (tokens.length === 0) return [];
      const { ids, tokens: heldTokens } = pairs(held);
      return query(reclaimSql, { queues, tokens: plainArray(tokens), heldIds: ids, heldTokens });
    },
  };
}
