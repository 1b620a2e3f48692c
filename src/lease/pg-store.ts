import { randomUUID } from "node:crypto";
import { setTimeout as delay } from "node:timers/promises";
import type pg from "pg";
import { OutboxError } from "../contract/errors.js";
import type { PreparedFollowUp } from "../contract/follow-up.js";
import type { FailureAnnouncement } from "../contract/handler.js";
import {
  type AckKeyedRow,
  completeStatements,
  deliveryKey,
  type FollowUpParams,
  type KeyRow,
  type PromotedRow,
  type PromoteParams,
} from "../sql/complete.js";
import {
  isPreparedStatementLost,
  plainArray,
  type Query,
  run,
  runQuery,
  statement,
  textArray,
} from "../sql/executor.js";
import { fetchStatement, type LeasedRow } from "../sql/fetch.js";
import type { OutboxNames } from "../sql/names.js";
import { reclaimStatement } from "../sql/own-leases.js";
import { NotifyThrottle } from "../util/notify-throttle.js";
import { QueueShares } from "./queue-shares.js";
import {
  type AckWrite,
  allLanded,
  type DeadWrite,
  type Delivery,
  type Landed,
  type LeaseStore,
  type LeaseTransaction,
  landedByKey,
  type RetryWrite,
  withHandOff,
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
}

const key = (d: Delivery) => deliveryKey(d.id, d.token);
const BEGIN = statement("begin", "BEGIN");
const COMMIT = statement("commit", "COMMIT");
// A handler's transaction is READ COMMITTED whatever the database's default: the keyed ack's promotion is a
// statement of its own so that its fresh snapshot sees every row a producer of the key committed; under
// REPEATABLE READ it would read the handler's first snapshot and could leave the key without a head.
const BEGIN_HANDLER = statement("begin_handler", "BEGIN ISOLATION LEVEL READ COMMITTED");
const ROLLBACK = statement("rollback", "ROLLBACK");
// Around a try of an ack with keyed follow-ups inside a handler's transaction: a busy answer (or a lock wait
// given up, 55P03, which would abort the whole transaction) undoes the try, and with it the key locks and
// turns it took, so no producer waits on this transaction while it waits on that producer.
const SAVEPOINT = statement("savepoint", "SAVEPOINT outbox_ack");
const ROLLBACK_TO_SAVEPOINT = statement("rollback_savepoint", "ROLLBACK TO SAVEPOINT outbox_ack");

/** Runs one statement: on the pool (its own implicit transaction), or on a handler's connection. */
type Runner = <P, R>(q: Query<P, R>, p: P) => Promise<R[]>;
const NOTIFY = statement("notify", "SELECT pg_notify($1, $2)");
/**
 * How long one write tries a key whose producer has not committed (its lock is busy) before answering it
 * busy: long enough for a typical producer transaction, short enough that one long one does not hold a
 * completion slot the other keys' outcomes need.
 */
const BUSY_WAIT_MS = 100;

function pushFollowUp(p: FollowUpParams, f: PreparedFollowUp): void {
  p.queues.push(f.queue);
  p.payloads.push(f.payloadText);
  p.headers.push(JSON.stringify(f.headers));
  p.keys.push(f.key);
  p.availableAt.push(f.availableAt);
  p.delaysMs.push(f.delayMs);
}

/** One round of a keyed completion: deliveries written (null: all not busy), busy ones, new heads. */
interface KeyedRound {
  keys: string[] | null;
  busy: Set<string>;
  next: PromotedRow[];
}

/** The lease store on Postgres: the fetch statement and the token-guarded writes of src/sql. */

/**
 * A follow-up insert the worker's role may not make fails every retry of its batch until the worker stops:
 * the error says which grant gives the right, not only "permission denied" (the code stays 42501).
 */
async function insertingFollowUps<T>(write: () => Promise<T>): Promise<T> {
  try {
    return await write();
  } catch (error) {
    if ((error as { code?: unknown }).code !== "42501") throw error;
    throw Object.assign(
      new OutboxError(
        `cannot insert follow-up messages: ${(error as Error).message} (the worker's role needs INSERT on messages: outbox-worker grant --worker <role> --worker-can-follow-up, then replay this dead letter)`,
        { cause: error },
      ),
      { code: "42501", followUpsRefused: true },
    );
  }
}

/** The Postgres lease store, which can also be told to stop naming its statements. */
export interface PgLeaseStore extends LeaseStore {
  /**
   * Every statement from now on is unnamed: a transaction-mode pooler was found before any failed.
   * False when they already were (the option, or a lost statement seen earlier).
   */
  useUnnamedStatements(): boolean;
}

export function createPgLeaseStore(options: PgLeaseStoreOptions): PgLeaseStore {
  const settings = { synchronousCommit: options.synchronousCommit };
  const leaseSql = fetchStatement(options.names, settings, options.queues.length === 1);
  const sql = completeStatements(options.names, settings);
  const reclaimSql = reclaimStatement(options.names, settings);
  const queues = [...options.queues];
  const unorderedQueues = [...(options.unorderedQueues ?? [])];
  const unordered = new Set(unorderedQueues);
  const shares = new QueueShares(queues);
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

  /**
   * One transaction on one connection: a keyed completion and the promotion of its successors commit
   * together, or neither does (a crash in between would leave the key with no head).
   */
  async function transaction<T>(work: (client: pg.PoolClient) => Promise<T>): Promise<T> {
    const client = await options.pool().connect();
    try {
      await run(client, BEGIN, [], { timeoutMs: options.queryTimeoutMs });
      const result = await work(client);
      await run(client, COMMIT, [], { timeoutMs: options.queryTimeoutMs });
      client.release();
      return result;
    } catch (error) {
      // Never hand a connection back mid-transaction (or mid-answer): destroy it, which rolls back.
      client.release(error instanceof Error ? error : new Error(String(error)));
      if (prepared && isPreparedStatementLost(error)) {
        prepared = false;
        options.onPreparedLost?.(error);
      }
      throw error;
    }
  }

  /**
   * Ack or dead-letter deliveries that may head a key, then promote the next row of each key whose head
   * went (handing up to `handOff` of them to the caller), in one transaction. The completion tries each
   * head's key lock; the promotion, a statement of its own and so with a fresh snapshot taken while the
   * locks are held, sees every row a producer of the key committed. A head whose key a producer is
   * publishing to right now stays in place (its lock is busy) and is tried again shortly; still busy after
   * BUSY_WAIT_MS, it is answered as busy (`Landed.busy`), for the caller to write again later. A producer
   * may hold its key for as long as its transaction runs: failing the batch instead would end in the
   * worker giving up, and a lease left to run out would deliver a handled message again.
   */
  async function completeKeyed<W extends { held: Delivery }>(
    writes: readonly W[],
    handOff: number,
    round: (ws: readonly W[], handOff: Omit<PromoteParams, "queues" | "keys">) => Promise<KeyedRound>,
  ): Promise<Landed> {
    const written = new Set<string>();
    let promoted = 0;
    const token = randomUUID();
    const handedOff: LeasedRow[] = [];
    let pending = writes;
    let allWritten = false;
    // From the first busy answer, not from the call: a round may first wait long for its ack turn, and
    // then find the key still being released by the ack ahead of it; it deserves its retries all the same.
    let deadline: number | undefined;
    let busy = new Set<string>();
    try {
      for (let attempt = 0; ; attempt++) {
        const answer = await round(pending, {
          limit: Math.max(0, handOff - handedOff.length),
          token,
          leaseTtlMs: options.leaseTtlMs,
          workerId: options.workerId,
        });
        const { keys, next } = answer;
        busy = answer.busy;
        // The rows go on as they came (a copy per row costs the worker more than the extra fields do).
        for (const n of next) {
          if (n.taken) handedOff.push(n);
          else promoted++;
        }
        // The common case: every delivery written in the first round, nothing to name.
        if (attempt === 0 && keys === null && busy.size === 0) {
          allWritten = true;
          break;
        }
        // Null keys: every delivery not busy was written.
        const wrote = keys ? new Set(keys) : undefined;
        for (const w of pending) {
          const k = key(w.held);
          if (!busy.has(k) && (wrote === undefined || wrote.has(k))) written.add(k);
        }
        if (busy.size === 0) break;
        options.onKeyBusy?.(busy.size);
        deadline ??= Date.now() + Math.min(options.queryTimeoutMs, BUSY_WAIT_MS);
        if (Date.now() > deadline) break;
        pending = pending.filter((w) => busy.has(key(w.held)));
        await delay(Math.min(2 ** attempt, 50));
      }
    } catch (error) {
      // Rows an earlier round of this call handed off are held by the caller all the same. (If the answer
      // to a round is lost, what it handed off is held by nobody who knows: those leases expire and the
      // rows are delivered then, as after a crash.)
      throw handedOff.length === 0 ? error : withHandOff(error, { token, rows: handedOff });
    }
    // New heads not handed off may be due now: without a wake-up they would wait for the next poll.
    if (promoted > 0) options.onPromoted?.(promoted);
    const landed = allWritten ? allLanded(writes.length) : landedByKey(written, key);
    return {
      ...landed,
      ...(handedOff.length > 0 ? { handedOff: { token, rows: handedOff } } : {}),
      ...(busy.size > 0 ? { busy: (d: Delivery) => busy.has(key(d)) } : {}),
    };
  }

  /** The keyed ack: one call of `ack_key_heads` or `ack_keyed` (completion, promotion and hand-off). */
  async function ackRound(
    ws: readonly AckWrite[],
    handOff: Omit<PromoteParams, "queues" | "keys">,
    run: Runner = query,
  ) {
    return keyedAnswer(ws, await ackKeyedIn(run, ws, handOff));
  }

  /** The queue and key of every delivery is known and none opted out of ordering: `ack_key_heads` applies. */
  const knownHeads = (ds: readonly Delivery[]) =>
    ds.every(
      (d) => d.queue !== undefined && d.key !== undefined && (d.key === null || !unordered.has(d.queue)),
    );

  /**
   * The keyed ack statement for `ws`: `ack_key_heads` when the queue and key of every delivery is known
   * and no delivery's queue opted out of ordering (the key locks are tried on them, no read before the
   * delete), else `ack_keyed`, which reads each row to learn whether it heads its key.
   */
  function ackKeyedIn(
    run: <P, R>(q: Query<P, R>, p: P) => Promise<R[]>,
    ws: readonly AckWrite[],
    handOff: Omit<PromoteParams, "queues" | "keys">,
  ): Promise<AckKeyedRow[]> {
    const ds = held(ws);
    if (!knownHeads(ds)) return run(sql.ackKeyed, { ...pairs(ds), ...handOff });
    return run(sql.ackKeyHeads, {
      ...pairs(ds),
      queues: textArray(ds.map((d) => d.queue as string)),
      keys: textArray(ds.map((d) => d.key ?? null)),
      ...handOff,
    });
  }

  // An ack waits for its turns on follow-up keys (behind other acks) at most this long: the server gives up
  // first, cleanly, before the query timeout would drop the connection.
  const turnTimeoutMs = Math.max(1, Math.floor(options.queryTimeoutMs / 2));

  /**
   * The keyed ack of deliveries with follow-ups, in one statement: the `ack_keyed` call, then the insert
   * of the follow-ups of the deliveries it deleted. Either both commit or neither: a crash or a failed
   * insert rolls the deletes back too, and the rows are delivered again. A delivery one of whose
   * follow-up keys is busy stays (answered busy, tried again shortly); the others go on now.
   */
  async function ackFollowUpRound(
    ws: readonly AckWrite[],
    handOff: Omit<PromoteParams, "queues" | "keys">,
    run: Runner = query,
  ): Promise<KeyedRound> {
    const follow = followUpParams(ws);
    if (!follow) return ackRound(ws, handOff, run);
    const ds = held(ws);
    const params = { ...pairs(ds), ...follow, ...handOff, turnTimeoutMs };
    const rows = await followUpKeysWrite(() =>
      knownHeads(ds)
        ? run(sql.ackKeyHeadsFollowUps, {
            ...params,
            parentQueues: textArray(ds.map((d) => d.queue as string)),
            parentKeys: textArray(ds.map((d) => d.key ?? null)),
          })
        : run(sql.ackKeyedFollowUps, params),
    );
    return rows ? keyedAnswer(ws, rows) : allBusy(ws);
  }

  /**
   * One round of the ack of keyless deliveries with keyed follow-ups, in one statement: their turns and key
   * locks first, then the deliveries whose keys were all taken acked with their follow-ups; those with a
   * busy key are answered busy and tried again (completeKeyed), the others land now.
   */
  async function ackFollowUpKeysRound(ws: readonly AckWrite[], run: Runner = query): Promise<KeyedRound> {
    const follow = followUpParams(ws);
    if (!follow) return { keys: null, busy: new Set(), next: [] };
    const rows = await followUpKeysWrite(() =>
      run(sql.ackFollowUpKeys, { ...pairs(held(ws)), ...follow, turnTimeoutMs }),
    );
    if (!rows) return allBusy(ws);
    return { keys: rows[0]?.keys ?? null, busy: new Set(rows[0]?.busy ?? []), next: [] };
  }

  /**
   * A write with keyed follow-ups; undefined when it gave up waiting for a lock (55P03: its turn, behind
   * an ack stuck for half the query timeout, or a row). Nothing of it was written: all busy, tried later.
   */
  async function followUpKeysWrite<R>(write: () => Promise<R[]>): Promise<R[] | undefined> {
    try {
      return await insertingFollowUps(write);
    } catch (error) {
      if ((error as { code?: unknown }).code === "55P03") return undefined;
      throw error;
    }
  }

  const allBusy = (ws: readonly AckWrite[]): KeyedRound => ({
    keys: [],
    busy: new Set(ws.map((w) => key(w.held))),
    next: [],
  });

  function keyedAnswer(ws: readonly AckWrite[], rows: AckKeyedRow[]): KeyedRound {
    let deleted = 0;
    const keys: string[] = [];
    const busy = new Set<string>();
    const next: PromotedRow[] = [];
    for (const r of rows) {
      if (r.kind === "deleted") deleted = Number(r.delivery);
      else if (r.kind === "written") keys.push(r.delivery);
      else if (r.kind === "busy") busy.add(r.delivery);
      else if (r.kind === "promoted") next.push(r);
    }
    return { keys: deleted === ws.length ? null : keys, busy, next };
  }

  /**
   * The keyed dead-letter move: the move, then the promotion (a statement of its own, so with a fresh
   * snapshot taken while the key locks are held), in one transaction.
   */
  async function deadRound(ws: readonly DeadWrite[], handOff: Omit<PromoteParams, "queues" | "keys">) {
    return transaction(async (client) => {
      const run = <P, R>(q: Query<P, R>, p: P) =>
        runQuery(client, q, p, { prepared, timeoutMs: options.queryTimeoutMs });
      const [row] = await deadMove(run, ws, true);
      const busy = new Set(row?.busy ?? []);
      const keys = row?.keys ?? null;
      if (!row || row.head_keys.length === 0) return { keys, busy, next: [] };
      const next = await run(sql.promote, { queues: row.head_queues, keys: row.head_keys, ...handOff });
      return { keys, busy, next };
    });
  }

  // Ids come back from the fetch as decimal text and tokens are our own UUIDs: both are safe unquoted.
  const pairs = (ds: readonly Delivery[]) => ({
    ids: plainArray(ds.map((d) => d.id)),
    tokens: plainArray(ds.map((d) => d.token)),
  });
  /**
   * The move, announcing the failures of queues configured so in the same statement; a batch with no such
   * queue runs the plain move (no announcement arrays, no extra work).
   */
  const deadMove = (
    run: <P, R>(q: Query<P, R>, p: P) => Promise<R[]>,
    ws: readonly DeadWrite[],
    keyed: boolean,
  ) => {
    const announce = options.announceFailures;
    const targets =
      announce && announce.size > 0
        ? ws.map((w) => (w.held.queue === undefined ? undefined : announce.get(w.held.queue)))
        : [];
    if (!targets.some((t) => t !== undefined)) return run(keyed ? sql.deadKeyed : sql.dead, deadParams(ws));
    return run(sql.deadAnnounced, {
      ...deadParams(ws),
      announceQueues: targets.map((t) => (t && "queue" in t ? t.queue : null)),
      announceTopics: targets.map((t) => (t && "topic" in t ? t.topic : null)),
      channel: options.names.channel,
    });
  };
  const deadParams = (ws: readonly DeadWrite[]) => ({
    ...pairs(held(ws)),
    reasons: ws.map((w) => w.reason),
    errors: ws.map((w) => w.error),
    attempted: ws.map((w) => w.attempted),
    failed: ws.map((w) => w.failed),
    maxErrorLength: options.maxErrorLength,
  });
  // Follow-ups wake other workers like publishes do, throttled per queue the same way: the first of a
  // window notifies in its own statement, a trailing notification covers the rest (a lost hint costs
  // latency only: the poll finds the rows).
  const throttle = new NotifyThrottle({
    cooldownMs: 2,
    maxCooldownMs: 8,
    trailing: (queue) => {
      run(options.pool(), NOTIFY, [options.names.channel, queue], {
        timeoutMs: options.queryTimeoutMs,
      }).catch(() => {});
    },
  });
  /** The follow-ups of `ws` as statement parameters; undefined when they have none. */
  const followUpParams = (ws: readonly AckWrite[]): FollowUpParams | undefined => {
    const p: FollowUpParams = {
      parents: [],
      queues: [],
      payloads: [],
      headers: [],
      keys: [],
      availableAt: [],
      delaysMs: [],
      channel: options.names.channel,
      wake: [],
    };
    const queuesSeen = new Set<string>();
    for (const w of ws) {
      for (const f of w.followUps ?? []) {
        p.parents.push(w.held.id);
        pushFollowUp(p, f);
        queuesSeen.add(f.queue);
      }
    }
    if (p.parents.length === 0) return undefined;
    for (const q of queuesSeen) if (throttle.claim(q)) p.wake.push(q);
    return p;
  };
  const landed = (rows: KeyRow[]) => landedByKey(new Set(rows.map((r) => r.key)), key);

  /**
   * One try of the ack of `w` on a handler's connection, in its transaction: the very statements of the
   * batched ack, with no hand-off (the successor of a key is promoted, and fetched as usual). → what it
   * found, and how many new heads it made (announced once the transaction commits).
   */
  async function ackInTransaction(
    run: Runner,
    w: AckWrite,
  ): Promise<{ found: "acked" | "lost" | "busy"; promoted: number }> {
    const ws = [w];
    const follows = w.followUps !== undefined && w.followUps.length > 0;
    if (w.held.key === null && !w.followUps?.some((f) => f.key !== null)) {
      const follow = follows ? followUpParams(ws) : undefined;
      const [result] = follow
        ? await insertingFollowUps(() => run(sql.ackFollowUps, { ...pairs(held(ws)), ...follow }))
        : await run(sql.ack, pairs(held(ws)));
      return { found: result?.deleted === 1 ? "acked" : "lost", promoted: 0 };
    }
    const noHandOff = {
      limit: 0,
      token: randomUUID(),
      leaseTtlMs: options.leaseTtlMs,
      workerId: options.workerId,
    };
    const round =
      w.held.key === null
        ? await ackFollowUpKeysRound(ws, run)
        : follows
          ? await ackFollowUpRound(ws, noHandOff, run)
          : await ackRound(ws, noHandOff, run);
    if (round.busy.size > 0) return { found: "busy", promoted: 0 };
    const acked = round.keys === null || round.keys.includes(key(w.held));
    return { found: acked ? "acked" : "lost", promoted: round.next.length };
  }

  async function begin(): Promise<LeaseTransaction> {
    const client = await options.pool().connect();
    const timeoutMs = options.queryTimeoutMs;
    /** Ends the transaction's use of the connection once: back to the pool, or destroyed. */
    let ended = false;
    const end = (error?: Error) => {
      if (ended) return;
      ended = true;
      client.release(error);
    };
    const runIn: Runner = async (q, p) => {
      try {
        return await runQuery(client, q, p, { prepared, timeoutMs });
      } catch (error) {
        if (prepared && isPreparedStatementLost(error)) {
          prepared = false;
          options.onPreparedLost?.(error);
        }
        throw error;
      }
    };
    try {
      await run(client, BEGIN_HANDLER, [], { timeoutMs });
    } catch (error) {
      end(error instanceof Error ? error : new Error(String(error)));
      throw error;
    }
    let promoted = 0;
    return {
      client,
      async ack(w) {
        // Only an ack with keyed follow-ups keeps locks from a busy try (the follow-up keys it did take).
        const guarded = w.followUps?.some((f) => f.key !== null) ?? false;
        if (guarded) await run(client, SAVEPOINT, [], { timeoutMs });
        const answer = await ackInTransaction(runIn, w);
        if (answer.found === "busy" && guarded) await run(client, ROLLBACK_TO_SAVEPOINT, [], { timeoutMs });
        promoted += answer.promoted;
        return answer.found;
      },
      async commit() {
        try {
          await run(client, COMMIT, [], { timeoutMs });
        } catch (error) {
          end(error instanceof Error ? error : new Error(String(error)));
          throw error;
        }
        end();
        // New heads are visible now, not before: a wake-up sent earlier would find nothing.
        if (promoted > 0) options.onPromoted?.(promoted);
      },
      async rollback(destroy) {
        if (ended) return;
        if (destroy) return end(destroy);
        try {
          await run(client, ROLLBACK, [], { timeoutMs });
          end();
        } catch (error) {
          end(error instanceof Error ? error : new Error(String(error)));
        }
      },
    };
  }
  const held = <W extends { held: Delivery }>(writes: readonly W[]) => writes.map((w) => w.held);

  return {
    begin,

    useUnnamedStatements() {
      const was = prepared;
      prepared = false;
      return was;
    },

    async lease(limit, maxBytes, keep = []) {
      const token = randomUUID();
      const split = shares.split(limit);
      const rows = await query(leaseSql, {
        queues,
        unorderedQueues,
        limit,
        maxBytes,
        keep,
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
        return completeKeyed(writes, handOff, (ws, h) =>
          follows ? ackFollowUpRound(ws, h) : ackRound(ws, h),
        );
      if (follows && writes.some((w) => w.followUps?.some((f) => f.key !== null)))
        return completeKeyed(writes, 0, (ws) => ackFollowUpKeysRound(ws));
      const follow = follows ? followUpParams(writes) : undefined;
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
      if (writes.some((w) => w.held.key !== null)) return completeKeyed(writes, handOff, deadRound);
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

/** Decimal ids in numeric order. */
function compareIds(a: string, b: string): number {
  return a.length - b.length || (a < b ? -1 : a > b ? 1 : 0);
}

/**
 * Writes in id order. Each statement locks its rows in the order of its arrays (the plan walks the unnest
 * and looks each id up), so the worker's statements all take rows in one order and never deadlock with
 * each other: a renewal racing a keyed ack of the same rows would otherwise wait for it in a cycle.
 */
function byId<T extends { held: Delivery } | Delivery>(items: readonly T[]): T[] {
  const id = (t: T) => ("held" in t ? t.held.id : t.id);
  return [...items].sort((a, b) => compareIds(id(a), id(b)));
}
