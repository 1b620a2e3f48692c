/**
 * The end of a transactional handler's run (a queue with `transaction: true`): its ack, follow-ups
 * included, runs in the handler's own open transaction, then COMMIT. The handler's writes, the delete of
 * its row under its lease token and the follow-ups commit together or not at all.
 */

import type pg from "pg";
import { OutboxError } from "../contract/errors.js";
import type { TransactionClient } from "../contract/handler.js";
import { type HeldRow, isLive } from "../lease/held.js";
import type { OutcomeOf } from "../lease/outcome.js";
import type { LeaseTransaction, RowFate } from "../lease/store.js";
import { backoffDelay } from "../retry/strategies.js";

/** How the ack's transaction ended. */
export type TransactionEnd =
  /** Committed: the handler's writes, the ack and the follow-ups are in. */
  | { kind: "acked" }
  /** Another token on the row (the lease was taken over): rolled back, nothing of it is in. */
  | { kind: "lost" }
  /** The delivery ended meanwhile (lease lost, or the stop gave up on it): rolled back, nothing to report. */
  | { kind: "dropped" }
  /** Rolled back (or the COMMIT is known not to have landed): the delivery is to be retried. */
  | { kind: "failed"; error: unknown };

export interface AckTransactionOptions {
  /** Where the row is now: read after a COMMIT whose answer was lost. */
  whereabouts(held: HeldRow): Promise<RowFate>;
  /** Until when a busy key is waited for; past it the transaction is rolled back and retried (transient). */
  busyUntil: number;
  /** Pauses between tries of a busy key: doubling from the first to the last (jittered). */
  busyBaseMs?: number;
  busyMaxMs?: number;
  /** A try found the key busy (a producer of it has not committed). */
  onBusy?(held: HeldRow): void;
}

/** A key was busy for longer than the handler's time allows: the transaction is rolled back and retried. */
export class KeyBusyError extends OutboxError {
  override name = "KeyBusyError";
  readonly transient = true;
}

/**
 * The handler's view of the open transaction: pg's `query`, refused once `open()` says the transaction is
 * no longer the handler's (it returned; a late query would run in the ack's transaction, or on a
 * connection back in the pool, used by someone else).
 */
export function handlerClient(client: pg.PoolClient, open: () => boolean): TransactionClient {
  const query = (...args: unknown[]) => {
    if (!open()) throw new OutboxError("message.transaction used after the handler returned: it is closed");
    return (client.query as (...a: unknown[]) => unknown)(...args);
  };
  return { query: query as pg.ClientBase["query"] };
}

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

/**
 * Ack `outcome` in `tx` and commit. The token fence decides: a row no longer under this delivery's token
 * means the lease was taken over, and the handler's writes are rolled back with it. `held.writing` is left
 * set: the caller records the end (settles or loses the delivery) first, then clears it, so a renewal that
 * raced the COMMIT never sees a live delivery whose row is gone.
 */
export async function commitWithAck(
  tx: LeaseTransaction,
  outcome: OutcomeOf<"ack">,
  options: AckTransactionOptions,
): Promise<TransactionEnd> {
  const { held } = outcome;
  for (let attempt = 1; ; attempt++) {
    // Lost while the handler ran (the heartbeat found another token) or abandoned by the stop: nothing of
    // this transaction may commit.
    if (!isLive(held)) {
      await tx.rollback();
      return { kind: "dropped" };
    }
    // HAZARD: from the ack's statement on, this transaction may hold the row (deleted, not committed). A
    // heartbeat renewal touching it would wait for our COMMIT, and the whole heartbeat (every other
    // row's renewal) with it. `writing` makes the heartbeat skip the row until the transaction has ended.
    held.writing = true;
    let found: "acked" | "lost" | "busy";
    try {
      found = await tx.ack(outcome);
    } catch (error) {
      // The statement failed: the transaction is aborted (nothing of it can commit). Roll back, retry.
      await tx.rollback(error instanceof Error ? error : new Error(String(error)));
      return { kind: "failed", error };
    }
    if (found === "lost") {
      await tx.rollback();
      return { kind: "lost" };
    }
    if (found === "acked") return commit(tx, held, options);
    // Busy: a producer of the key (or of a follow-up's key) has not committed. The try kept nothing (no row
    // lock, no key lock), so while we wait the heartbeat may renew the lease again: `writing` off.
    held.writing = false;
    options.onBusy?.(held);
    if (Date.now() >= options.busyUntil) {
      await tx.rollback();
      return {
        kind: "failed",
        error: new KeyBusyError(
          "the ack's transaction waited too long for a producer's open transaction on its key: rolled back, retried",
        ),
      };
    }
    // Waiting inside the transaction, not blocking on the lock: a producer may wait for a lock the handler
    // took, and a blocked wait would then be a deadlock; the busy deadline bounds a livelock the same way.
    await sleep(
      backoffDelay(attempt, { baseMs: options.busyBaseMs ?? 10, maxMs: options.busyMaxMs ?? 1000 }),
    );
  }
}

/** COMMIT; when its answer is lost, the row's fate tells whether it landed (row gone: acked). */
async function commit(
  tx: LeaseTransaction,
  held: HeldRow,
  options: AckTransactionOptions,
): Promise<TransactionEnd> {
  try {
    await tx.commit();
    return { kind: "acked" };
  } catch (error) {
    // The connection is destroyed (commit does that on failure): the server either committed or rolled
    // back. Guessing either way is wrong half the time: a missed ack redelivers a handled message, a
    // missed retry leaves its lease to run out. The row tells.
    for (let attempt = 1; ; attempt++) {
      try {
        const fate = await options.whereabouts(held);
        if (fate === "gone") return { kind: "acked" };
        if (fate === "held" || fate === "unleased") return { kind: "failed", error };
        return { kind: "lost" };
      } catch {
        // Unknown: the lease is left to run out, and the row (if still there) is delivered again.
        if (attempt >= 3) return { kind: "lost" };
        await sleep(backoffDelay(attempt, { baseMs: 200, maxMs: 2000 }));
      }
    }
  }
}
