import { randomUUID } from "node:crypto";
import type pg from "pg";
import { OutboxError } from "../contract/errors.js";
import type { FailureAnnouncement } from "../contract/handler.js";
import { UNLEASED_TOKEN } from "../sql/complete.js";
import {
  defineQuery,
  isPreparedStatementLost,
  plainArray,
  run,
  runQuery,
  statement,
} from "../sql/executor.js";
import {
  type HeldByTransactionRow,
  heldAloneStatement,
  heldByTransactionStatement,
  type LeasedRow,
  suspectsWaitingStatement,
} from "../sql/fetch.js";
import { suspectSet } from "../sql/lease-guards.js";
import type { OutboxNames } from "../sql/names.js";
import { COMMIT, ROLLBACK_TO_SAVEPOINT, SAVEPOINT } from "../sql/transaction.js";
import { createPgLeaseStore } from "./pg-store.js";
import type { AckWrite, DeadWrite, Delivery, Landed, RetryWrite } from "./store.js";

export interface BatchLeaseOptions {
  pool: () => pg.Pool;
  names: OutboxNames;
  queues: readonly string[];
  unorderedQueues: readonly string[];
  workerId: string;
  maxErrorLength: number;
  synchronousCommit: boolean;
  preparedStatements: () => boolean;
  queryTimeoutMs: number;
  /**
   * How long the batch's transaction may sit idle before the server ends it (and so releases its rows): the
   * lease TTL. Bounds what a worker cut off from the server (a half-open socket, a frozen process) keeps
   * locked; a live worker keeps its batches from idling that long (`keepAlive`, every heartbeat).
   */
  idleTimeoutMs: number;
  /** How long after a statement on the batch's connection was sent the batch counts as alive (the idle timeout less a margin). */
  confirmedForMs: number;
  announceFailures?: ReadonlyMap<string, FailureAnnouncement>;
  /** New key heads became visible at a batch's commit: they can be leased now. */
  onPromoted?: (rows: number) => void;
  onKeyBusy?: (heads: number) => void;
  onPreparedLost?: (error: unknown) => void;
}

/** How each delivery of a batch ended; rows named in none were never started (nothing is written for them). */
export interface BatchOutcomes {
  acks: readonly AckWrite[];
  retries: readonly RetryWrite[];
  dead: readonly DeadWrite[];
  /** Deliveries whose handler ran but ended with no outcome (the stop's timeout): counted, nothing else. */
  ranWithout: readonly Delivery[];
  /**
   * Rows this batch holds but did not run because another batch of this worker, which ended before its
   * commit, ran them: counted here, under this batch's lock, as far as that batch's guard (`guard`) still
   * names them, and struck from it (so counted exactly once, here or by the repair).
   */
  owed?: readonly { id: string; guard: string }[];
}

/**
 * Rows leased by the transaction that holds them (leaseMode "transaction"): locked FOR UPDATE on a
 * connection of the batch's own, written nothing until their outcomes, which are written in that same
 * transaction, and committed at once.
 */
export interface HeldBatch {
  /** This batch, in this process: its deliveries carry it as their token. */
  readonly id: string;
  /** Its guard row (lease_guards.id). */
  readonly guard: string;
  readonly rows: readonly LeasedRow[];
  /**
   * Until when (performance.now()) the server cannot have ended the transaction for idling: the send time
   * of its last statement plus the confirmation span. Past it, the batch may be gone (a frozen worker).
   */
  readonly validUntil: number;
  /** Whether the connection was seen to end (an error, a failed keep-alive): its rows are no longer held. */
  readonly ended: boolean;
  /**
   * A cheap statement in the batch's transaction: it resets the server's idle timer and confirms the batch
   * still holds its rows → true; false once the connection has ended (then `onEnded` has been called).
   * Never throws; a no-op (true) while another statement is in flight, false after commit or rollback.
   */
  keepAlive(): Promise<boolean>;
  /** Called once, when the connection is seen to end before the batch's commit or rollback. */
  onEnded(listener: (error: Error) => void): void;
  /**
   * After the batch failed: the guard names only `ids` (the rows that ran in it), so the repair charges and
   * leaves to run alone those, not the rows that never started (`alone` when one row alone ran); then waits
   * (at most a query timeout) for the server to have ended the transaction, so that the repair can count
   * it. Best effort: never throws.
   */
  settleGuard(ids: readonly string[]): Promise<void>;
  /**
   * Writes the outcomes and commits; the connection then goes back to the pool → the deliveries left
   * unwritten (a producer held their key past BUSY_GIVE_UP_MS: delivered again). Throws: nothing landed.
   */
  commit(outcomes: BatchOutcomes): Promise<readonly Delivery[]>;
  /** Ends the transaction without a write: its rows are due again at once. Never throws. */
  rollback(error?: Error): Promise<void>;
}

/**
 * How long the outcomes of a batch try keys a producer holds (busy) before the batch commits without them:
 * those rows stay as they are, and are delivered again. A producer holding a key's lock for this long would
 * otherwise keep the batch's other rows, and the key locks its acks took, from committing.
 */
const BUSY_GIVE_UP_MS = 5_000;

export interface BatchLeaser {
  /**
   * Leases up to `limit` rows in a new transaction → the batch, or undefined (none due; nothing held).
   * `alone`: the one oldest row held through a crash instead (see LeaseStore.leaseAlone), or none.
   */
  lease(limit: number, maxBytes?: number, alone?: boolean): Promise<HeldBatch | undefined>;
  /** Whether a row held through a crash waits (LeaseStore.suspectsWaiting). */
  suspectsWaiting(): Promise<boolean>;
}

export function createBatchLeaser(options: BatchLeaseOptions): BatchLeaser {
  const { names, queryTimeoutMs: timeoutMs } = options;
  const select = heldByTransactionStatement(names, options.queues.length === 1);
  const selectAlone = heldAloneStatement(names);
  const suspects = suspectsWaitingStatement(names);
  const guards = `${names.quotedSchema}.lease_guards`;
  const insertGuard = defineQuery<{ ids: string; xid: string; alone: boolean }, { id: string }>(
    "lease_guard",
    `INSERT INTO ${guards} (ids, xid, worker, alone) VALUES ($1::bigint[], $2::xid8, $3, $4) RETURNING id::text AS id`,
    (p) => [p.ids, p.xid, options.workerId, p.alone],
  );
  // The guard's delete and the COMMIT in one round trip (the simple protocol: several statements, no
  // parameters). The id is the bigint the guard's INSERT returned, checked to be digits before it is spliced.
  const endGuarded = (id: string) => {
    if (!/^\d+$/.test(id)) throw new OutboxError(`not a guard id: ${JSON.stringify(id)}`);
    return { name: "", text: `DELETE FROM ${guards} WHERE id = ${id}; COMMIT` };
  };
  const countDelivery = defineQuery<{ ids: string }, never>(
    "lease_count_delivery",
    `UPDATE ${names.messages} SET deliveries_count = LEAST(deliveries_count, 2147483646) + 1
WHERE id = ANY ($1::bigint[])`,
    (p) => [p.ids],
  );
  // A handler that ran past the stop's timeout ended without an outcome, as in a crash: its row is left held
  // through one (leased alone next, as a token lease left to expire is).
  const countRanWithout = defineQuery<{ ids: string }, never>(
    "lease_count_ran_without",
    `UPDATE ${names.messages} AS t SET deliveries_count = LEAST(t.deliveries_count, 2147483646) + 1,
  ${suspectSet("$2")}
WHERE t.id = ANY ($1::bigint[])`,
    (p) => [p.ids, options.workerId],
  );
  // One round trip: the transaction, its bound on idling, and its commit's WAL wait.
  const begin = statement(
    "lease_batch_begin",
    `BEGIN ISOLATION LEVEL READ COMMITTED; SET LOCAL idle_in_transaction_session_timeout = ${Math.ceil(options.idleTimeoutMs)}${
      options.synchronousCommit ? "" : "; SET LOCAL synchronous_commit = off"
    }; SAVEPOINT lease_pick`,
  );
  const opts = () => ({ prepared: options.preparedStatements(), timeoutMs });
  const narrow = defineQuery<{ id: string; ids: string; xid: string }, { done: boolean }>(
    "lease_guard_narrow",
    // Narrowed, never widened: a row a later batch of this worker already counted has been struck from it.
    `WITH narrowed AS (
  UPDATE ${guards} AS k SET ids = n.ids, alone = cardinality(n.ids) = 1
  FROM (SELECT ARRAY(SELECT x FROM unnest(g.ids) AS x WHERE x = ANY ($2::bigint[])) AS ids
        FROM ${guards} AS g WHERE g.id = $1::bigint) AS n
  WHERE k.id = $1::bigint
)
SELECT pg_xact_status($3::xid8) IS DISTINCT FROM 'in progress' AS done`,
    (p) => [p.id, p.ids, p.xid],
  );
  // Counts what the guards still name of the rows (once per guard, as the repair would) and strikes them
  // from the guards, in the batch's transaction: a guard the repair has counted already names nothing.
  const strike = defineQuery<{ guards: string; ids: string }, never>(
    "lease_guard_strike",
    `WITH g AS (
  SELECT id, ids, worker, alone FROM ${guards} WHERE id = ANY ($1::bigint[]) AND ids && $2::bigint[] FOR UPDATE
), named AS (
  SELECT u.id, ((bool_or(NOT g.alone))::int + count(*) FILTER (WHERE g.alone))::int AS n, min(g.worker) AS worker
  FROM g CROSS JOIN LATERAL unnest(g.ids) AS u(id)
  WHERE u.id = ANY ($2::bigint[]) GROUP BY u.id
), struck AS (
  UPDATE ${guards} AS k SET ids = ARRAY(SELECT x FROM unnest(k.ids) AS x WHERE x <> ALL ($2::bigint[]))
  FROM g WHERE k.id = g.id
)
UPDATE ${names.messages} AS t SET deliveries_count = LEAST(t.deliveries_count::bigint + n.n, 2147483647)::int,
  ${suspectSet("n.worker")}
FROM named AS n WHERE t.id = n.id`,
    (p) => [p.guards, p.ids],
  );
  const over = defineQuery<{ xid: string }, { done: boolean }>(
    "lease_batch_over",
    `SELECT pg_xact_status($1::xid8) IS DISTINCT FROM 'in progress' AS done`,
    (p) => [p.xid],
  );

  return {
    async suspectsWaiting() {
      const [row] = await runQuery(
        options.pool(),
        suspects,
        { queues: options.queues, unorderedQueues: options.unorderedQueues },
        opts(),
      );
      return row?.waiting === true;
    },

    async lease(limit, maxBytes, alone = false) {
      const client = await options.pool().connect();
      // Held for the batch's whole run, idle between statements: a server ending the session (a restart, a
      // terminated backend, the idle timeout) errors the client then, not during a statement. pg-pool only
      // listens while a client is idle in the pool; unheard, that error would crash the process. Heard, it
      // ends the batch at once: its rows not yet started must not start (another worker may hold them now).
      let endedBy: ((error: Error) => void) | undefined;
      let seenEnded: Error | undefined;
      const onError = (error: Error) => {
        if (seenEnded) return;
        seenEnded = error;
        endedBy?.(error);
      };
      client.on("error", onError);
      const release = client.release.bind(client);
      client.release = (error?: Error | boolean) => {
        client.off("error", onError);
        client.release = release;
        return release(error);
      };
      // Before BEGIN: the server's idle timer starts after each statement, so it cannot fire before this
      // plus the idle timeout.
      let validUntil = performance.now() + options.confirmedForMs;
      let rows: HeldByTransactionRow[];
      try {
        // Several statements in one string: the simple protocol, never named.
        await run(client, begin, [], { timeoutMs });
        rows = alone
          ? await runQuery(
              client,
              selectAlone,
              { queues: options.queues, unorderedQueues: options.unorderedQueues },
              opts(),
            )
          : await runQuery(
              client,
              select,
              {
                queues: options.queues,
                unorderedQueues: options.unorderedQueues,
                limit,
                ...(maxBytes === undefined ? {} : { maxBytes }),
              },
              opts(),
            );
      } catch (error) {
        client.release(asError(error));
        noticeLost(error);
        throw error;
      }
      try {
        if (rows.length > 0 && (rows[0] as HeldByTransactionRow).locked > rows.length) {
          rows = await keepTaken(client, rows);
        }
      } catch (error) {
        client.release(asError(error));
        throw error;
      }
      if (rows.length === 0) {
        await end(client, COMMIT);
        return undefined;
      }
      const first = rows[0] as HeldByTransactionRow;
      let guard: string;
      try {
        // The crash-loop guard, committed before any handler runs: a crash from here on leaves it behind,
        // and the repair counts the delivery it names (src/worker/guard-repair.ts).
        const [inserted] = await runQuery(
          options.pool(),
          insertGuard,
          { ids: plainArray(rows.map((r) => r.id)), xid: first.xid, alone },
          opts(),
        );
        guard = (inserted as { id: string }).id;
      } catch (error) {
        client.release(asError(error));
        noticeLost(error);
        throw error;
      }
      const tokens = new Map(rows.map((r) => [r.id, r.lease_token]));
      let ended = false;
      let ping: Promise<boolean> | undefined;
      const keepAlive = async (): Promise<boolean> => {
        if (seenEnded) return false;
        if (ended) return false;
        const sent = performance.now();
        try {
          await run(client, KEEP_ALIVE, [], { timeoutMs });
        } catch (error) {
          // A batch whose keep-alive fails is no longer to be trusted with its rows (a dead or stuck
          // connection): ended, so nothing more of it starts; its commit fails and the rows come back.
          onError(asError(error));
          return false;
        }
        if (!seenEnded) validUntil = Math.max(validUntil, sent + options.confirmedForMs);
        return !seenEnded;
      };
      return {
        id: randomUUID(),
        guard,
        rows,
        get validUntil() {
          return validUntil;
        },
        get ended() {
          return seenEnded !== undefined;
        },
        keepAlive() {
          // One at a time: a keep-alive queued behind another adds nothing.
          ping ??= keepAlive().finally(() => {
            ping = undefined;
          });
          return ping;
        },
        onEnded(listener) {
          endedBy = listener;
          if (seenEnded) listener(seenEnded);
        },
        async settleGuard(ids) {
          // A killed backend reports its end to the client before it has rolled back: until it has, the
          // repair cannot count the guard, while its rows may already be free to lease again.
          const until = performance.now() + timeoutMs;
          try {
            let [row] = await runQuery(
              options.pool(),
              narrow,
              { id: guard, ids: plainArray(ids), xid: first.xid },
              opts(),
            );
            while (!row?.done && performance.now() < until) {
              await new Promise((resolve) => setTimeout(resolve, 5));
              [row] = await runQuery(options.pool(), over, { xid: first.xid }, opts());
            }
          } catch {
            // The repair counts the guard as it stands (every row, if the narrowing did not land).
          }
        },
        async commit(outcomes) {
          if (ended) throw new OutboxError("batch already ended");
          if (seenEnded) throw seenEnded;
          // A keep-alive in flight finishes first (the client queues statements): awaited so a failure it
          // meets is this commit's too, not a second report.
          ended = true;
          await ping;
          let written: Written;
          try {
            written = await writeOutcomes(client, outcomes, tokens);
            await run(client, endGuarded(guard), [], { timeoutMs });
          } catch (error) {
            // Destroyed, not returned: the server rolls back, the rows are due again, the guard counts them.
            client.release(asError(error));
            throw error;
          }
          client.release();
          // New heads are visible now, not before: a wake-up sent earlier would find nothing.
          if (written.promoted > 0) options.onPromoted?.(written.promoted);
          return written.busy;
        },
        async rollback(error) {
          if (ended) return;
          ended = true;
          client.release(error ?? new OutboxError("batch rolled back"));
        },
      };
    },
  };

  /**
   * The scans locked rows the cut left out (a queue's share, the byte budget): held until the batch ends,
   * they would be out of every worker's reach. Rolled back to before the scans (every lock they took goes),
   * the rows taken are locked again, each only if it is still the version read: a row another worker
   * changed in between (leased, acked) is dropped from the batch. One round trip (the simple protocol:
   * the ids and versions are digits from the statement, checked before they are spliced).
   */
  async function keepTaken(
    client: pg.PoolClient,
    rows: HeldByTransactionRow[],
  ): Promise<HeldByTransactionRow[]> {
    const digits = (values: string[]) => {
      for (const v of values) if (!/^\d+$/.test(v)) throw new OutboxError(`not a row id or version: ${v}`);
      return `'{${values.join(",")}}'`;
    };
    const result = (await client.query({
      text: `ROLLBACK TO SAVEPOINT lease_pick; SELECT t.id::text AS id FROM ${names.messages} AS t
JOIN unnest(${digits(rows.map((r) => r.id))}::bigint[], ${digits(rows.map((r) => r.version))}::text[]) AS v(id, version)
  ON v.id = t.id AND t.xmin::text = v.version
FOR UPDATE OF t SKIP LOCKED`,
      query_timeout: timeoutMs,
    } as pg.QueryConfig)) as unknown as pg.QueryResult<{ id: string }>[];
    const kept = new Set((result[result.length - 1]?.rows ?? []).map((r) => r.id));
    return rows.filter((r) => kept.has(r.id));
  }

  async function writeOutcomes(
    client: pg.PoolClient,
    outcomes: BatchOutcomes,
    tokens: ReadonlyMap<string, string | null>,
  ): Promise<Written> {
    let promoted = 0;
    const busy: Delivery[] = [];
    const store = createPgLeaseStore({
      pool: options.pool,
      within: client,
      names,
      queues: options.queues,
      unorderedQueues: options.unorderedQueues,
      workerId: options.workerId,
      leaseTtlMs: 0,
      maxErrorLength: options.maxErrorLength,
      synchronousCommit: true,
      preparedStatements: options.preparedStatements(),
      queryTimeoutMs: timeoutMs,
      ...(options.announceFailures ? { announceFailures: options.announceFailures } : {}),
      onPromoted: (n) => {
        promoted += n;
      },
      ...(options.onKeyBusy ? { onKeyBusy: options.onKeyBusy } : {}),
      ...(options.onPreparedLost ? { onPreparedLost: options.onPreparedLost } : {}),
    });
    // Each write fenced by the token its row carries (an expired lease's, or none: UNLEASED_TOKEN), not the
    // batch's in-process id its deliveries carry.
    const fenced = <W extends { held: Delivery }>(w: W): W => ({
      ...w,
      held: { ...w.held, token: tokens.get(w.held.id) ?? UNLEASED_TOKEN },
    });
    // A retry, a dead-letter move or a delivery that ran without an outcome counts the delivery, as the token
    // lease counted it when it leased the row (an ack deletes the row: nothing to count).
    const counted = [...outcomes.retries.map((w) => w.held.id), ...outcomes.dead.map((w) => w.held.id)];
    if (counted.length > 0) await runQuery(client, countDelivery, { ids: plainArray(counted) }, opts());
    if (outcomes.ranWithout.length > 0) {
      const ids = plainArray(outcomes.ranWithout.map((d) => d.id));
      await runQuery(client, countRanWithout, { ids }, opts());
    }
    if (outcomes.owed && outcomes.owed.length > 0) {
      const owed = outcomes.owed;
      await runQuery(
        client,
        strike,
        {
          guards: plainArray([...new Set(owed.map((o) => o.guard))]),
          ids: plainArray(owed.map((o) => o.id)),
        },
        opts(),
      );
    }
    const deadline = Date.now() + BUSY_GIVE_UP_MS;
    const keyedFollowUps = (w: AckWrite) => w.followUps?.some((f) => f.key !== null) ?? false;
    await untilWritten(
      outcomes.acks.filter((w) => !keyedFollowUps(w)).map(fenced),
      (ws) => store.ack(ws),
      deadline,
      busy,
    );
    const withKeys = outcomes.acks.filter(keyedFollowUps).map(fenced);
    if (withKeys.length > 0)
      await allOrNone(client, timeoutMs, withKeys, (ws) => store.ack(ws), deadline, busy);
    await untilWritten(outcomes.retries.map(fenced), (ws) => store.retry(ws), deadline, busy);
    await untilWritten(outcomes.dead.map(fenced), (ws) => store.deadLetter(ws), deadline, busy);
    return { promoted, busy };
  }

  /** A transaction-mode pooler loses named statements between transactions: unnamed from now on. */
  function noticeLost(error: unknown): void {
    if (options.preparedStatements() && isPreparedStatementLost(error)) options.onPreparedLost?.(error);
  }

  async function end(client: pg.PoolClient, how: typeof COMMIT): Promise<void> {
    try {
      await run(client, how, [], { timeoutMs });
      client.release();
    } catch (error) {
      client.release(asError(error));
      throw error;
    }
  }
}

/** What a batch's writes did: new key heads, and deliveries left unwritten (their key stayed busy). */
interface Written {
  promoted: number;
  busy: Delivery[];
}

const busyAll: Landed = { count: 0, has: () => false, busy: () => true };

/**
 * The acks with keyed follow-ups, all in one try or none: a follow-up key's lock, once taken, is held until
 * the batch commits, so two batches (of this worker or another) each holding a key the other's follow-ups
 * need would wait on each other for good. A try that finds any key busy (or gives up a lock wait, 55P03,
 * which would abort the whole batch) is rolled back to its savepoint, every lock it took with it, and
 * tried again after a random pause, so contending batches do not retry in step.
 */
async function allOrNone(
  client: pg.PoolClient,
  timeoutMs: number,
  writes: readonly AckWrite[],
  write: (ws: readonly AckWrite[]) => Promise<Landed>,
  deadline: number,
  left: Delivery[],
): Promise<void> {
  const control = (s: typeof SAVEPOINT) => run(client, s, [], { timeoutMs });
  for (let attempt = 0; ; attempt++) {
    await control(SAVEPOINT);
    let landed: Landed;
    try {
      landed = await write(writes);
    } catch (error) {
      if ((error as { code?: unknown }).code !== "55P03") throw error;
      landed = busyAll;
    }
    if (!writes.some((w) => landed.busy?.(w.held))) return;
    await control(ROLLBACK_TO_SAVEPOINT);
    if (Date.now() > deadline) {
      left.push(...writes.map((w) => w.held));
      return;
    }
    await new Promise((resolve) => setTimeout(resolve, Math.random() * Math.min(2 ** attempt * 5, 200)));
  }
}

/**
 * Writes `writes` until none is left busy (a producer of its key has not committed yet), or the deadline:
 * what is still busy then stays as it is, and is delivered again once the batch commits.
 */
async function untilWritten<W extends { held: Delivery }>(
  writes: readonly W[],
  write: (ws: readonly W[]) => Promise<Landed>,
  deadline: number,
  left: Delivery[],
): Promise<void> {
  let pending = writes;
  for (let attempt = 0; pending.length > 0; attempt++) {
    const landed = await write(pending);
    const busy = landed.busy;
    if (!busy) return;
    pending = pending.filter((w) => busy(w.held));
    if (pending.length > 0 && Date.now() > deadline) {
      left.push(...pending.map((w) => w.held));
      return;
    }
    await new Promise((resolve) => setTimeout(resolve, Math.min(2 ** attempt, 50)));
  }
}

/** The batch's keep-alive: any statement resets the server's idle timer; this one reads nothing. */
const KEEP_ALIVE = statement("lease_batch_keep_alive", "SELECT 1");

function asError(error: unknown): Error {
  return error instanceof Error ? error : new Error(String(error));
}
