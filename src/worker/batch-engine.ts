import type { Logger } from "pino";
import type { Outcome } from "../complete/completer.js";
import { OutboxError } from "../contract/errors.js";
import { Dispatcher } from "../dispatch/dispatcher.js";
import { LocalQueue } from "../dispatch/local-queue.js";
import { Fetcher } from "../fetch/fetcher.js";
import { type HeldRow, heldRows, lose, settle } from "../lease/held.js";
import type { OutcomeOf } from "../lease/outcome.js";
import type { BatchLeaser, HeldBatch } from "../lease/pg-batch.js";
import type { Delivery } from "../lease/store.js";
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
  size: number;
  /** Its rows' payload bytes (text), counted against maxHeldBytes until it commits. */
  bytes: number;
  /** Rows of the batch with no outcome yet (queued or running). */
  open: number;
  outcomes: Outcome[];
  ranWithout: HeldRow[];
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

  // The byte budget bounds the payload text held (as the token engine's prefetch does), each batch half of
  // it so that two can run. Sized by the rows recent batches brought, a batch's scans seldom lock rows the
  // statement's cut then leaves out (those cost the batch a round trip to release: pg-batch keepTaken).
  let heldBytes = 0;
  const rowSize = new RowSize();
  const batchBudget = () =>
    Math.min(Math.floor(options.maxHeldBytes / MAX_BATCHES), options.maxHeldBytes - heldBytes);

  const queue = new LocalQueue<HeldRow>(capacity);
  const fetcher = new Fetcher<HeldRow>({
    ...fetchPacing(options),
    // One batch per fetch: none while MAX_BATCHES are held or the budget is spent (a commit frees one
    // and fetches again).
    free: () => {
      const budget = batchBudget();
      if (batches.size >= MAX_BATCHES || budget <= 0) return 0;
      const fit = rowSize.rowsIn(budget);
      if (fit === undefined) return queue.free;
      // A row larger than the budget is still taken, alone, when nothing else is held.
      return Math.min(queue.free, batches.size === 0 ? Math.max(1, fit) : fit);
    },
    lease: async (limit) => {
      if (stopping) return { rows: [] };
      if (unrepaired.size > 0) {
        await repair.repairNow();
        const left = await repair.left([...unrepaired]);
        for (const id of unrepaired) if (!left.has(id)) unrepaired.delete(id);
      }
      // The statement's cut counts stored sizes: it bounds a batch before the row size is known.
      const batch = await leaser.lease(limit, Math.max(1, batchBudget()));
      health.recovered("fetch");
      if (!batch) return { rows: [] };
      // A stop that began while the batch was leased: nothing of it started, so end it unwritten.
      if (stopping) {
        await batch.rollback();
        return { rows: [] };
      }
      const rows = heldRows(batch.id, batch.rows);
      let bytes = 0;
      for (const row of batch.rows) bytes += payloadBytes(row);
      rowSize.learn(rows.length, bytes);
      heldBytes += bytes;
      batches.set(batch.id, {
        held: batch,
        size: rows.length,
        bytes,
        open: rows.length,
        outcomes: [],
        ranWithout: [],
        committing: undefined,
      });
      return { rows };
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
    ...dispatchReports(deps),
  });

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
      });
      commitFailures = 0;
      health.recovered("complete");
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
      await repair.stop();
      return { drained: finished && committed && batches.size === 0, released: handedBack.length, abandoned };
    },
    get held() {
      return held;
    },
    reclaimStale: () => (stopping ? Promise.resolve(0) : repair.runOnce()),
  };
}
