import { randomUUID } from "node:crypto";
import { setTimeout as delay } from "node:timers/promises";
import type { LeasedRow } from "../sql/fetch.js";
import type { KeyedRound } from "./pg-keyed-rounds.js";
import { type HandOff, key } from "./pg-params.js";
import { allLanded, type Delivery, type Landed, landedByKey, withHandOff } from "./store.js";

/**
 * How long one write tries a key whose producer has not committed (its lock is busy) before answering it
 * busy: long enough for a typical producer transaction, short enough that one long one does not hold a
 * completion slot the other keys' outcomes need.
 */
const BUSY_WAIT_MS = 100;

export interface BusyRetryOptions {
  leaseTtlMs: number;
  workerId: string;
  queryTimeoutMs: number;
  /** A keyed completion made rows the heads of their keys: they can be leased now. */
  onPromoted?: (rows: number) => void;
  /** Some key heads could not be completed yet: a producer of their key is in flight (retried shortly). */
  onKeyBusy?: (heads: number) => void;
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
export async function completeKeyed<W extends { held: Delivery }>(
  options: BusyRetryOptions,
  writes: readonly W[],
  handOff: number,
  round: (ws: readonly W[], handOff: HandOff) => Promise<KeyedRound>,
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
