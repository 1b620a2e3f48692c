import { OutboxError } from "../contract/errors.js";
import type { PreparedFollowUp } from "../contract/follow-up.js";
import type { FollowUpParams } from "../sql/complete.js";
import { NotifyThrottle } from "../util/notify-throttle.js";
import type { PgSession } from "./pg-session.js";
import type { AckWrite } from "./store.js";

/** The follow-ups of acks as statement parameters, and the wake-ups of the queues they go to. */
export interface FollowUps {
  /** The follow-ups of `ws` as statement parameters; undefined when they have none. */
  params(ws: readonly AckWrite[]): FollowUpParams | undefined;
  /**
   * How long an ack waits for its turns on follow-up keys (behind other acks): the server gives up first,
   * cleanly, before the query timeout would drop the connection.
   */
  readonly turnTimeoutMs: number;
}

export function createFollowUps(session: PgSession, channel: string, queryTimeoutMs: number): FollowUps {
  // Follow-ups wake other workers like publishes do, throttled per queue the same way: the first of a
  // window notifies in its own statement, a trailing notification covers the rest (a lost hint costs
  // latency only: the poll finds the rows).
  const throttle = new NotifyThrottle({
    cooldownMs: 2,
    maxCooldownMs: 8,
    trailing: (queue) => {
      session.notify(channel, queue).catch(() => {});
    },
  });
  return {
    turnTimeoutMs: Math.max(1, Math.floor(queryTimeoutMs / 2)),
    params(ws) {
      const p: FollowUpParams = {
        parents: [],
        queues: [],
        payloads: [],
        headers: [],
        keys: [],
        availableAt: [],
        delaysMs: [],
        channel,
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
    },
  };
}

function pushFollowUp(p: FollowUpParams, f: PreparedFollowUp): void {
  p.queues.push(f.queue);
  p.payloads.push(f.payloadText);
  p.headers.push(JSON.stringify(f.headers));
  p.keys.push(f.key);
  p.availableAt.push(f.availableAt);
  p.delaysMs.push(f.delayMs);
}

/**
 * A follow-up insert the worker's role may not make fails every retry of its batch until the worker stops:
 * the error says which grant gives the right, not only "permission denied" (the code stays 42501).
 */
export async function insertingFollowUps<T>(write: () => Promise<T>): Promise<T> {
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

/**
 * A write with keyed follow-ups; undefined when it gave up waiting for a lock (55P03: its turn, behind
 * an ack stuck for half the query timeout, or a row). Nothing of it was written: all busy, tried later.
 */
export async function followUpKeysWrite<R>(write: () => Promise<R[]>): Promise<R[] | undefined> {
  try {
    return await insertingFollowUps(write);
  } catch (error) {
    if ((error as { code?: unknown }).code === "55P03") return undefined;
    throw error;
  }
}
