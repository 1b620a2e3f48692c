import type { Logger } from "pino";
import type { Outcome } from "../complete/completer.js";
import { OutboxError } from "../contract/errors.js";
import { Dispatcher } from "../dispatch/dispatcher.js";
import { LocalQueue } from "../dispatch/local-queue.js";
import { Fetcher } from "../fetch/fetcher.js";
import { confirmedNow, type HeldRow, heldRows, lose, settle } from "../lease/held.js";
import type { OutcomeOf } from "../lease/outcome.js";
import type { BatchLeaser, HeldBatch } from "../lease/pg-batch.js";
import type { Delivery } from "../lease/store.js";
import { AloneRuns } from "./alone-runs.js";
import { dispatchRules, type Engine, fetchPacing, type StopResult } from "./engine.js";
import { within } from "./engine-stop.js";
import type { WorkerEmitter } from "./events.js";
import type { GuardRepair } from "./guard-repair.js";
import { payloadBytes } from "./held-set.js";
import type { LoopHealth } from "./loop-health.js";
import type { ResolvedOptions } from "./options.js";
import { dispatchReports, reportLanded } from "./reports.js";
import { RowSize } from "./row-size.js";

export interface BatchEngineDeps {
  options: ResolvedOptions;
  leaser: BatchLeaser;
  repair: GuardRepair;
  log: Logger;
  emitter: WorkerEmitter;
  health: LoopHealth;
  onFatal(error: Error): void;
}

/**
 * Batches held at once: while one batch's handlers finish and it commits, the next one's run. Each holds
 * a pooled connection (idle in its transaction) until it commits.
 */
const MAX_BATCHES = 2;

const SETTLED = { ack: "acked", retry: "retried", dead: "dead" } as const;

/** One transaction-held batch in this process: its rows, and the outcomes decided so far. */
interface Batch {
  held: HeldBatch;
  rows: HeldRow[];
  size: number;
  /** Its rows' payload bytes (text), counted against maxHeldBytes until it commits. */
  bytes: number;
  /** Rows of the batch with no outcome yet (queued or running). */
  open: number;
  outcomes: Outcome[];
  ranWithout: HeldRow[];
  /** Rows it holds that an ended batch of this worker ran (see BatchOutcomes.owed): counted at its commit. */
  owed: { id: string; guard: string }[];
  /** Seen to have ended before its commit (its connection's error, or its rows leased again). */
  ended: boolean;
  committing: Promise<void> | undefined;
}

/**
 * The delivery engine of leaseMode "transaction": fetch → local queue → dispatch, as the token engine,
 * but each fetch is a batch whose rows stay locked by the transaction that leased them, and whose outcomes
 * are written in that transaction once every row has one (then one commit). No heartbeat (a lock needs no
 * renewal) and no token lease written: a crash rolls the transaction back, and the guard row the batch
 * committed beside it lets the repair count the delivery (GuardRepair).
 */
export function createBatchEngine(deps: BatchEngineDeps): Engine {
  const { options, leaser, repair, log, emitter, health } = deps;
  const capacity = MAX_BATCHES * Math.max(options.batchSize, options.concurrency);
  const batches = new Map<string, Batch>();
  let held = 0;
  let stopping = false;
  let commitFailures = 0;
  /**
   * Guards of this worker's batches that failed to commit and are not repaired yet: each fetch repairs them
   * first, so their rows never come back to this worker uncounted (a crash loop must reach maxDeliveries).
   * A guard stays while its transaction is still being rolled back (its rows are locked: no fetch takes
   * them) or another worker holds its rows (that one delivers them; the count follows when they are free).
   */
  const unrepaired = new Set<string>();
  /**
   * Rows that ran in a batch of this worker that ended before its commit, with that batch's guard, until
   * the guard is repaired: a batch that leases one of them meanwhile does not run it (its handler may still
   * run, or its run is not counted yet); it counts the run under its own lock (BatchOutcomes.owed).
   */
  const owedRuns = new Map<string, string>();

  // The byte budget bounds the payload text held (as the token engine's prefetch does), each batch half of
  // it so that two can run. Sized by the rows recent batches brought, a batch's scans seldom lock rows the
  // statement's cut then leaves out (those cost the batch a round trip to release: pg-batch keepTaken).
  let heldBytes = 0;
  const rowSize = new RowSize();
  const batchBudget = () =>
    Math.min(Math.floor(options.maxHeldBytes / MAX_BATCHES), options.maxHeldBytes - heldBytes);

  const queue = new LocalQueue<HeldRow>(capacity);
  /** Rows for the next batch: none while MAX_BATCHES are held or the budget is spent. */
  function freeForBatch(): number {
    const budget = batchBudget();
    if (batches.size >= MAX_BATCHES || budget <= 0) return 0;
    // A batch that ended early still runs handlers whose rows its end released: a fetch now could lease
    // them to this worker again and start a message twice at once. Wait until they have returned.
    for (const b of batches.values()) if (b.ended || b.held.ended) return 0;
    const fit = rowSize.rowsIn(budget);
    if (fit === undefined) return queue.free;
    // A row larger than the budget is still taken, alone, when nothing else is held.
    return Math.min(queue.free, batches.size === 0 ? Math.max(1, fit) : fit);
  }

  // Rows held through a crash are leased alone, in a batch of their own with nothing else held (AloneRuns).
  const alone = new AloneRuns({
    probe: () => leaser.suspectsWaiting(),
    intervalMs: options.heartbeatMs,
    wake: () => fetcher.trigger(),
    log,
  });
  const fetcher = new Fetcher<HeldRow>({
    ...fetchPacing(options),
    // One batch per fetch (a commit frees one and fetches again).
    free: () => alone.free(batches.size, freeForBatch),
    lease: async (limit) => {
      if (stopping) return { rows: [] };
      if (unrepaired.size > 0) {
        await repair.repairNow();
        const left = await repair.left([...unrepaired]);
        for (const id of unrepaired) if (!left.has(id)) unrepaired.delete(id);
        for (const [row, guard] of owedRuns) if (!left.has(guard)) owedRuns.delete(row);
      }
      // The statement's cut counts stored sizes: it bounds a batch before the row size is known.
      const lonely = alone.next;
      const batch = await leaser.lease(limit, Math.max(1, batchBudget()), lonely);
      health.recovered("fetch");
      // None held through a crash waits: lease a batch at once.
      if (lonely && !batch) alone.took(undefined);
      if (!batch) return lonely ? { rows: [], more: true } : { rows: [] };
      // A stop that began while the batch was leased: nothing of it started, so end it unwritten.
      if (stopping) {
        await batch.rollback();
        return { rows: [] };
      }
      const rows = heldRows(batch.id, batch.rows, batch.validUntil);
      let bytes = 0;
      for (const row of batch.rows) bytes += payloadBytes(row);
      rowSize.learn(rows.length, bytes);
      heldBytes += bytes;
      const again = heldElsewhere(rows);
      for (const h of rows) {
        const guard = owedRuns.get(h.id);
        if (guard !== undefined) again.set(h.id, guard);
      }
      const entry: Batch = {
        held: batch,
        rows,
        size: rows.length - again.size,
        bytes,
        open: rows.length,
        outcomes: [],
        ranWithout: [],
        owed: [...again].map(([id, guard]) => ({ id, guard })),
        ended: false,
        committing: undefined,
      };
      batches.set(batch.id, entry);
      batch.onEnded((error) => ended(entry, error));
      if (lonely) alone.took(rows[0]);
      if (again.size === 0) return { rows };
      // Not started twice at once in this worker: this batch leaves them as they are (due again).
      for (const h of rows) {
        if (!again.has(h.id)) continue;
        settle(h, "released");
        decided(h, "unstarted");
      }
      return { rows: rows.filter((h) => !again.has(h.id)) };
    },
    deliver: (rows) => {
      held += rows.length;
      queue.push(rows);
      emitter.emit("fetched", { count: rows.length });
    },
    onError: (error, n) => health.failed("fetch", error, n),
    onFatal: deps.onFatal,
  });

  const dispatcher = new Dispatcher({
    queue,
    ...dispatchRules(options),
    submit: (o) => decided(o.held, o),
    confirm: (h) => confirm(h),
    ...dispatchReports(deps),
  });

  // Keep-alives: a batch whose rows wait for a slot, or for an earlier batch, sits idle in its transaction;
  // without them the server's idle timeout would end it with its handlers healthy, and every row of it
  // would run again. Each also confirms the batch still holds its rows (see `confirm`).
  let keepAlives: NodeJS.Timeout | undefined;
  function keepAlive(batch: Batch): Promise<boolean> {
    return batch.held.keepAlive().then((alive) => {
      if (alive) for (const h of batch.rows) h.validUntil = batch.held.validUntil;
      return alive;
    });
  }

  /**
   * A queued row whose batch's confirmation ran out (the process was frozen past it): ask the batch's
   * connection once more. A batch that answers still holds the row; one that does not has ended, and the
   * row is not started (another worker may be running it, or its key's next rows, by now).
   */
  async function confirm(h: HeldRow): Promise<boolean> {
    const batch = batches.get(h.token);
    if (batch && !batch.ended && !batch.held.ended && (await keepAlive(batch)) && confirmedNow(h))
      return true;
    if (lostUnstarted(h)) decided(h, "unstarted");
    return false;
  }

  /**
   * The batch's connection ended before its commit (killed, timed out, restarted): none of its queued rows
   * may start; those running finish, their outcomes lost with the batch. Only the rows that ran count a
   * delivery when it fails (see commit): a row that never started is never charged.
   */
  function ended(batch: Batch, error: Error): void {
    if (batches.get(batch.held.id) !== batch || batch.committing || batch.ended) return;
    batch.ended = true;
    const id = batch.held.id;
    // A row a dispatch loop has taken but not started yet must ask too (and find the batch gone).
    for (const h of batch.rows) h.validUntil = Number.NEGATIVE_INFINITY;
    const unstarted = queue.remove((h) => h.token === id);
    for (const h of batch.rows)
      if (h.state === "running" || h.state === "completing") owedRuns.set(h.id, batch.held.guard);
    log.warn(
      { err: error, rows: batch.size, unstarted: unstarted.length },
      "a transaction-held batch's connection ended before its commit: its messages not started are not started, and are delivered again",
    );
    for (const h of unstarted) if (lostUnstarted(h)) decided(h, "unstarted");
  }

  /**
   * The ids among `rows` that another batch of this worker still holds in memory. That batch's transaction
   * has ended (this one could not have locked them otherwise), though its connection's error may not have
   * been heard yet: it is ended now, and a row that ran there is not started again here (not twice at once,
   * nor before that run is counted: this batch holds the row, so it counts the run itself, exactly once).
   */
  function heldElsewhere(rows: readonly HeldRow[]): Map<string, string> {
    const again = new Map<string, string>();
    if (batches.size === 0) return again;
    const ids = new Set(rows.map((h) => h.id));
    for (const b of batches.values()) {
      let overlaps = false;
      for (const h of b.rows) {
        // A row that ran there (running, or its outcome waiting for a commit not yet sent, which will
        // fail) is not run here: this batch counts that run at its commit. A queued row of the ended
        // batch is dropped there and runs here. (A committing batch may have committed: left alone.)
        const ran = h.state === "running" || (h.state === "completing" && !b.committing);
        if (!ran || !ids.has(h.id)) continue;
        again.set(h.id, b.held.guard);
        overlaps = true;
      }
      if (overlaps) ended(b, new OutboxError("its rows were leased again: its transaction has ended"));
    }
    return again;
  }

  /** A row dropped before its handler started: reported lost (another worker may hold it now). */
  function lostUnstarted(h: HeldRow): boolean {
    if (!lose(h, new OutboxError("its batch could not be confirmed alive: not started"))) return false;
    const { id, queue: q, deliveries_count: deliveries } = h.row;
    emitter.emit("lease_lost", { id, queue: q, deliveries, phase: "start" });
    return true;
  }

  /** A row of a batch has its outcome (or, with none, ended without one): the last one commits the batch. */
  function decided(h: HeldRow, outcome: Outcome | "ran" | "unstarted"): void {
    const batch = batches.get(h.token);
    if (!batch) return;
    if (outcome === "ran") batch.ranWithout.push(h);
    else if (outcome !== "unstarted") batch.outcomes.push(outcome);
    batch.open--;
    if (batch.open === 0) batch.committing = commit(h.token, batch);
  }

  async function commit(id: string, batch: Batch): Promise<void> {
    const of = <K extends Outcome["kind"]>(kind: K) =>
      batch.outcomes.filter((o): o is OutcomeOf<K> => o.kind === kind);
    try {
      const left = await batch.held.commit({
        acks: of("ack"),
        retries: of("retry"),
        dead: of("dead"),
        ranWithout: batch.ranWithout,
        owed: batch.owed,
      });
      commitFailures = 0;
      health.recovered("complete");
      for (const o of batch.owed) if (owedRuns.get(o.id) === o.guard) owedRuns.delete(o.id);
      const unwritten = new Set(left.map((d: Delivery) => d.id));
      for (const o of batch.outcomes) {
        if (unwritten.has(o.held.id)) {
          lost(o.held);
          continue;
        }
        settle(o.held, SETTLED[o.kind]);
        reportLanded(deps, o);
      }
    } catch (error) {
      const err = error instanceof Error ? error : new Error(String(error));
      commitFailures++;
      log.warn(
        { err, rows: batch.outcomes.length },
        "a transaction-held batch could not commit: its messages are delivered again",
      );
      for (const o of batch.outcomes) lost(o.held);
      health.failed("complete", err, commitFailures);
      // The live worker knows which rows of it ran (their delivery ended without its outcome, as a lost
      // token lease's does) and which never started: the guard is narrowed to the former before the repair
      // counts it (a failed narrowing leaves every row counted, as after a crash).
      const charged = new Set(batch.rows.filter((h) => h.startedAt > 0).map((h) => h.id));
      for (const id of charged) owedRuns.set(id, batch.held.guard);
      await batch.held.settleGuard([...charged]);
      unrepaired.add(batch.held.guard);
      if (commitFailures >= options.maxConsecutiveFailures) deps.onFatal(err);
    } finally {
      batches.delete(id);
      held -= batch.size;
      heldBytes -= batch.bytes;
      if (!stopping) fetcher.slotsFreed();
    }
  }

  /** Its outcome did not land (the commit failed, or its key stayed busy): it is delivered again. */
  function lost(h: HeldRow): void {
    if (!lose(h, new OutboxError("the batch's transaction ended without its outcomes: delivered again")))
      return;
    const { id, queue: q, deliveries_count: deliveries } = h.row;
    emitter.emit("lease_lost", { id, queue: q, deliveries, phase: "ack" });
  }

  return {
    startDispatching() {
      dispatcher.start();
    },
    startFetching() {
      // A crash loop's restart counts its crash before the row is leased again.
      void repair.runOnce().finally(() => {
        repair.start();
        fetcher.start();
      });
      alone.start();
      keepAlives = setInterval(() => {
        for (const b of batches.values()) if (!b.committing && !b.ended && !b.held.ended) void keepAlive(b);
      }, options.heartbeatMs);
      keepAlives.unref();
    },
    wake: () => fetcher.trigger(),
    setWakeUps: (on) => fetcher.setWakeUps(on),
    async shutdown(timeoutMs, alongside): Promise<StopResult> {
      stopping = true;
      const deadline = Date.now() + timeoutMs;
      const left = () => Math.max(0, deadline - Date.now());
      const writeGrace = () => Math.max(1000, left());
      await within(Promise.all([fetcher.stop(), alongside]), writeGrace());
      // Unstarted rows need no write: the commit leaves them as they were, due at once.
      const handedBack = queue.drain();
      queue.close();
      for (const h of handedBack) {
        settle(h, "released");
        decided(h, "unstarted");
      }
      let abandoned: string[] = [];
      const finished = await within(dispatcher.done(), left());
      if (!finished) {
        const rows = dispatcher.abandon(new OutboxError("worker stop timeout"));
        for (const h of rows) decided(h, "ran");
        abandoned = rows.map((h) => h.row.id);
        log.warn(
          { abandoned },
          "stop timeout: handlers aborted, their messages are due again once their batch commits",
        );
        emitter.emit("drain_timeout", { abandoned });
      }
      const committed = await within(
        Promise.all([...batches.values()].map((b) => b.committing)),
        writeGrace(),
      );
      for (const b of batches.values())
        if (!b.committing) await b.held.rollback(new OutboxError("worker stop"));
      clearInterval(keepAlives);
      alone.stop();
      await repair.stop();
      return { drained: finished && committed && batches.size === 0, released: handedBack.length, abandoned };
    },
    get held() {
      return held;
    },
    reclaimStale: () => (stopping ? Promise.resolve(0) : repair.runOnce()),
  };
}
