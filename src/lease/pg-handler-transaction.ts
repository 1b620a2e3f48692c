import { randomUUID } from "node:crypto";
import type { CompleteStatements } from "../sql/complete.js";
import { BEGIN_HANDLER, COMMIT, ROLLBACK, ROLLBACK_TO_SAVEPOINT, SAVEPOINT } from "../sql/transaction.js";
import { type FollowUps, insertingFollowUps } from "./pg-follow-ups.js";
import type { KeyedRounds } from "./pg-keyed-rounds.js";
import { held, key, pairs } from "./pg-params.js";
import type { PgSession, Runner } from "./pg-session.js";
import type { AckWrite, LeaseTransaction } from "./store.js";

export interface HandlerTransactionOptions {
  sql: CompleteStatements;
  session: PgSession;
  followUps: FollowUps;
  rounds: KeyedRounds;
  leaseTtlMs: number;
  workerId: string;
  /** New heads became visible at the commit: they can be leased now. */
  onPromoted?: (rows: number) => void;
}

/** Opens handlers' transactions, each on a pooled connection of its own, and acks inside them. */
export function handlerTransactions(options: HandlerTransactionOptions): () => Promise<LeaseTransaction> {
  const { session } = options;

  return async function begin(): Promise<LeaseTransaction> {
    const client = await session.connect();
    /** Ends the transaction's use of the connection once: back to the pool, or destroyed. */
    let ended = false;
    const end = (error?: Error) => {
      if (ended) return;
      ended = true;
      client.release(error);
    };
    const runIn = session.runnerOn(client);
    try {
      await session.control(client, BEGIN_HANDLER);
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
        if (guarded) await session.control(client, SAVEPOINT);
        const answer = await ackInTransaction(options, runIn, w);
        if (answer.found === "busy" && guarded) await session.control(client, ROLLBACK_TO_SAVEPOINT);
        promoted += answer.promoted;
        return answer.found;
      },
      async commit() {
        try {
          await session.control(client, COMMIT);
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
          await session.control(client, ROLLBACK);
          end();
        } catch (error) {
          end(error instanceof Error ? error : new Error(String(error)));
        }
      },
    };
  };
}

/**
 * One try of the ack of `w` on a handler's connection, in its transaction: the very statements of the
 * batched ack, with no hand-off (the successor of a key is promoted, and fetched as usual). → what it
 * found, and how many new heads it made (announced once the transaction commits).
 */
async function ackInTransaction(
  options: HandlerTransactionOptions,
  run: Runner,
  w: AckWrite,
): Promise<{ found: "acked" | "lost" | "busy"; promoted: number }> {
  const { sql, followUps, rounds } = options;
  const ws = [w];
  const follows = w.followUps !== undefined && w.followUps.length > 0;
  if (w.held.key === null && !w.followUps?.some((f) => f.key !== null)) {
    const follow = follows ? followUps.params(ws) : undefined;
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
      ? await rounds.ackFollowUpKeys(ws, run)
      : follows
        ? await rounds.ackFollowUps(ws, noHandOff, run)
        : await rounds.ack(ws, noHandOff, run);
  if (round.busy.size > 0) return { found: "busy", promoted: 0 };
  const acked = round.keys === null || round.keys.includes(key(w.held));
  return { found: acked ? "acked" : "lost", promoted: round.next.length };
}
