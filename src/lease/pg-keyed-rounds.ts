import type { AckKeyedRow, CompleteStatements, PromotedRow } from "../sql/complete.js";
import { textArray } from "../sql/executor.js";
import type { DeadMove } from "./pg-dead-letters.js";
import { type FollowUps, followUpKeysWrite } from "./pg-follow-ups.js";
import { type HandOff, held, key, pairs } from "./pg-params.js";
import type { PgSession, Runner } from "./pg-session.js";
import type { AckWrite, DeadWrite, Delivery } from "./store.js";

/** One round of a keyed completion: deliveries written (null: all not busy), busy ones, new heads. */
export interface KeyedRound {
  keys: string[] | null;
  busy: Set<string>;
  next: PromotedRow[];
}

/**
 * One try of each keyed write, as one statement (or one transaction): what it wrote, what it found busy,
 * what it promoted. `run` is the pool by default, or a handler's connection.
 */
export interface KeyedRounds {
  /** The keyed ack: one call of `ack_key_heads` or `ack_keyed` (completion, promotion and hand-off). */
  ack(ws: readonly AckWrite[], handOff: HandOff, run?: Runner): Promise<KeyedRound>;
  /**
   * The keyed ack of deliveries with follow-ups, in one statement: the `ack_keyed` call, then the insert
   * of the follow-ups of the deliveries it deleted. Either both commit or neither: a crash or a failed
   * insert rolls the deletes back too, and the rows are delivered again. A delivery one of whose
   * follow-up keys is busy stays (answered busy, tried again shortly); the others go on now.
   */
  ackFollowUps(ws: readonly AckWrite[], handOff: HandOff, run?: Runner): Promise<KeyedRound>;
  /**
   * The ack of keyless deliveries with keyed follow-ups, in one statement: their turns and key locks first,
   * then the deliveries whose keys were all taken acked with their follow-ups; those with a busy key are
   * answered busy and tried again (completeKeyed), the others land now.
   */
  ackFollowUpKeys(ws: readonly AckWrite[], run?: Runner): Promise<KeyedRound>;
  /**
   * The keyed dead-letter move: the move, then the promotion (a statement of its own, so with a fresh
   * snapshot taken while the key locks are held), in one transaction.
   */
  dead(ws: readonly DeadWrite[], handOff: HandOff): Promise<KeyedRound>;
}

export interface KeyedRoundsOptions {
  sql: CompleteStatements;
  session: PgSession;
  followUps: FollowUps;
  deadMove: DeadMove;
  /** Queues whose keys are plain metadata: no per-key ordering. */
  unordered: ReadonlySet<string>;
}

export function createKeyedRounds(options: KeyedRoundsOptions): KeyedRounds {
  const { sql, session, followUps, deadMove, unordered } = options;

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
  function ackKeyedIn(run: Runner, ws: readonly AckWrite[], handOff: HandOff): Promise<AckKeyedRow[]> {
    const ds = held(ws);
    if (!knownHeads(ds)) return run(sql.ackKeyed, { ...pairs(ds), ...handOff });
    return run(sql.ackKeyHeads, {
      ...pairs(ds),
      queues: textArray(ds.map((d) => d.queue as string)),
      keys: textArray(ds.map((d) => d.key ?? null)),
      ...handOff,
    });
  }

  async function ack(ws: readonly AckWrite[], handOff: HandOff, run: Runner = session.query) {
    return keyedAnswer(ws, await ackKeyedIn(run, ws, handOff));
  }

  async function ackFollowUps(
    ws: readonly AckWrite[],
    handOff: HandOff,
    run: Runner = session.query,
  ): Promise<KeyedRound> {
    const follow = followUps.params(ws);
    if (!follow) return ack(ws, handOff, run);
    const ds = held(ws);
    const params = { ...pairs(ds), ...follow, ...handOff, turnTimeoutMs: followUps.turnTimeoutMs };
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

  async function ackFollowUpKeys(ws: readonly AckWrite[], run: Runner = session.query): Promise<KeyedRound> {
    const follow = followUps.params(ws);
    if (!follow) return { keys: null, busy: new Set(), next: [] };
    const rows = await followUpKeysWrite(() =>
      run(sql.ackFollowUpKeys, { ...pairs(held(ws)), ...follow, turnTimeoutMs: followUps.turnTimeoutMs }),
    );
    if (!rows) return allBusy(ws);
    return { keys: rows[0]?.keys ?? null, busy: new Set(rows[0]?.busy ?? []), next: [] };
  }

  async function dead(ws: readonly DeadWrite[], handOff: HandOff): Promise<KeyedRound> {
    return session.transaction(async (run) => {
      const [row] = await deadMove(run, ws, true);
      const busy = new Set(row?.busy ?? []);
      const keys = row?.keys ?? null;
      if (!row || row.head_keys.length === 0) return { keys, busy, next: [] };
      const next = await run(sql.promote, { queues: row.head_queues, keys: row.head_keys, ...handOff });
      return { keys, busy, next };
    });
  }

  return { ack, ackFollowUps, ackFollowUpKeys, dead };
}

const allBusy = (ws: readonly AckWrite[]): KeyedRound => ({
  keys: [],
  busy: new Set(ws.map((w) => key(w.held))),
  next: [],
});

/** The rows of a keyed ack as a round: deleted count, written deliveries, busy ones, new heads. */
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
