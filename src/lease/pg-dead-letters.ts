import type { FailureAnnouncement } from "../contract/handler.js";
import type { CompleteStatements, KeyedRow } from "../sql/complete.js";
import { held, pairs } from "./pg-params.js";
import type { Runner } from "./pg-session.js";
import type { DeadWrite } from "./store.js";

export interface DeadMoveOptions {
  sql: CompleteStatements;
  maxErrorLength: number;
  /** Queues whose dead-letter moves also publish a failure event, and where to (migration 0018). */
  announceFailures?: ReadonlyMap<string, FailureAnnouncement>;
  channel: string;
}

/**
 * The dead-letter move of `ws` (keyed: trying each head's key lock), announcing the failures of queues
 * configured so in the same statement; a batch with no such queue runs the plain move (no announcement
 * arrays, no extra work).
 */
export type DeadMove = (run: Runner, ws: readonly DeadWrite[], keyed: boolean) => Promise<KeyedRow[]>;

export function createDeadMove(options: DeadMoveOptions): DeadMove {
  const { sql } = options;
  const deadParams = (ws: readonly DeadWrite[]) => ({
    ...pairs(held(ws)),
    reasons: ws.map((w) => w.reason),
    errors: ws.map((w) => w.error),
    attempted: ws.map((w) => w.attempted),
    failed: ws.map((w) => w.failed),
    maxErrorLength: options.maxErrorLength,
  });
  return (run, ws, keyed) => {
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
      channel: options.channel,
    });
  };
}
