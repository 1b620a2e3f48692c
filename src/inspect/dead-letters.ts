import { OutboxConfigError } from "../contract/errors.js";
import {
  type DeadLetterRow as DeadLetter,
  getDeadLetterStatement,
  listDeadLettersStatement,
  previewPurgeStatement,
  previewReplayStatement,
  previewRouteUnroutedStatement,
  purgeDeadLettersStatement,
  type ReplayCountRow,
  type ReplayParams,
  replayDeadLettersStatement,
  routeUnroutedDeadLettersStatement,
} from "../sql/dead-letters.js";
import { type Executor, runQuery } from "../sql/executor.js";
import { outboxNames } from "../sql/names.js";
import { checkLimit, checkOptionalText } from "./peek.js";

export type { DeadLetterRow as DeadLetter } from "../sql/dead-letters.js";

/** A message id: ids are `bigint`, so strings are the lossless form. */
export type MessageId = string | number | bigint;

/** Filters for {@link listDeadLetters}; every given field must match. */
export interface DeadLetterQuery {
  /** Only this queue's dead letters. */
  queue?: string;
  /** Only this reason, e.g. `rejected` or `retries_exhausted`. */
  reason?: string;
  /** 1 to 1000, default 20. */
  limit?: number;
}

/** Every given field must match; `{ all: true }` is the only way to select every dead letter. */
export type ReplayFilter =
  | { all: true }
  | { all?: false; ids?: readonly MessageId[]; queue?: string; reason?: string };

/** One queue's share of a {@link ReplayResult}. */
export interface ReplayQueueCount {
  queue: string;
  replayed: number;
  /** Left in dead_letters because a message with the same id exists. */
  skipped: number;
  skippedIds: string[];
  /**
   * Left in dead_letters because a producer kept their key's lock (a transaction writing that key) until
   * `busyTimeoutMs` ran out: replay them again. 0 unless that happened.
   */
  busy: number;
  busyIds: string[];
}

/** What {@link replayDeadLetters} moved back (or, with `dryRun`, would move). */
export interface ReplayResult {
  /** True when nothing was changed. */
  dryRun: boolean;
  /** Dead letters moved back into messages, all queues together. */
  replayed: number;
  /** Dead letters left where they are because a message with the same id exists. */
  skipped: number;
  /** Dead letters left where they are because producers kept their keys' locks past `busyTimeoutMs`. */
  busy: number;
  /** The same counts per queue, with the skipped (and busy) ids. */
  queues: ReplayQueueCount[];
}

/** Options of {@link replayDeadLetters}. */
export interface ReplayOptions {
  /** Count what would be replayed, change nothing. */
  dryRun?: boolean;
  /**
   * How long replay keeps trying the keys producers hold (default 30000 ms); what is still busy then stays
   * a dead letter, reported as `busy`.
   */
  busyTimeoutMs?: number;
}

const DEFAULT_BUSY_TIMEOUT_MS = 30_000;
/** Pauses before busy keys are tried again: doubling from the first to the last, jittered. */
const BUSY_PAUSE_MIN_MS = 10;
const BUSY_PAUSE_MAX_MS = 500;

/** Which dead letters {@link purgeDeadLetters} deletes. */
export interface PurgeOptions {
  /** Delete dead letters that died more than this long ago; must be positive. */
  olderThanMs: number;
  /** Only this queue's dead letters. */
  queue?: string;
  /** Count what would be deleted, delete nothing. */
  dryRun?: boolean;
}

/** What {@link purgeDeadLetters} deleted (or, with `dryRun`, would delete). */
export interface PurgeResult {
  /** True when nothing was deleted. */
  dryRun: boolean;
  /** Dead letters deleted, all queues together. */
  purged: number;
  /** The same count per queue. */
  queues: { queue: string; purged: number }[];
}

const MAX_BIGINT = 9223372036854775807n;

export function checkMessageId(id: MessageId, field = "id"): string {
  const text = typeof id === "string" ? id : String(id);
  if (!/^[0-9]{1,19}$/.test(text) || BigInt(text) < 1n || BigInt(text) > MAX_BIGINT) {
    throw new OutboxConfigError(
      field,
      `must be a positive whole number (a message id), got ${JSON.stringify(text)}`,
    );
  }
  return BigInt(text).toString();
}

/**
 * Dead letters (messages that will not be delivered again unless replayed), newest first, optionally of one
 * queue or reason. Reads only.
 *
 * @param db - a pg pool or client, or a Kysely instance
 * @param schema - the outbox schema, usually `"outbox"` ({@link DEFAULT_SCHEMA})
 */
export async function listDeadLetters(
  db: Executor,
  schema: string,
  query: DeadLetterQuery = {},
): Promise<DeadLetter[]> {
  return runQuery(db, listDeadLettersStatement(outboxNames(schema)), {
    queue: checkOptionalText(query.queue),
    reason: checkOptionalText(query.reason, "reason"),
    limit: checkLimit(query.limit),
  });
}

/** The dead letter with this id (its id in messages, kept), or undefined. Reads only. */
export async function getDeadLetter(
  db: Executor,
  schema: string,
  id: MessageId,
): Promise<DeadLetter | undefined> {
  const rows = await runQuery(db, getDeadLetterStatement(outboxNames(schema)), { id: checkMessageId(id) });
  return rows[0];
}

function replayParams(filter: ReplayFilter): ReplayParams {
  if (filter.all === true) {
    const extra = filter as { ids?: unknown; queue?: unknown; reason?: unknown };
    if (extra.ids !== undefined || extra.queue !== undefined || extra.reason !== undefined) {
      throw new OutboxConfigError("all", "cannot be combined with ids, queue or reason");
    }
    return { ids: null, queue: null, reason: null };
  }
  if (filter.ids === undefined && filter.queue === undefined && filter.reason === undefined) {
    throw new OutboxConfigError(
      "filter",
      "give ids, a queue or a reason; replaying every dead letter needs { all: true }",
    );
  }
  return {
    ids: filter.ids?.map((id) => checkMessageId(id, "ids")) ?? null,
    queue: checkOptionalText(filter.queue),
    reason: checkOptionalText(filter.reason, "reason"),
  };
}

/** Adds one try's rows to `queues` (by queue, in order of first appearance); busy ids are the try's own. */
function addTry(queues: Map<string, ReplayQueueCount>, rows: ReplayCountRow[]): void {
  for (const q of queues.values()) {
    q.busy = 0;
    q.busyIds = [];
  }
  for (const r of rows) {
    let q = queues.get(r.queue);
    if (!q) {
      q = { queue: r.queue, replayed: 0, skipped: 0, skippedIds: [], busy: 0, busyIds: [] };
      queues.set(r.queue, q);
    }
    q.replayed += r.replayed;
    q.skipped += r.skipped;
    q.skippedIds.push(...r.skipped_ids);
    q.busy += r.busy_ids.length;
    q.busyIds.push(...r.busy_ids);
  }
}

function replayResult(queueCounts: Map<string, ReplayQueueCount>, dryRun: boolean): ReplayResult {
  const queues = [...queueCounts.values()];
  return {
    dryRun,
    replayed: queues.reduce((n, q) => n + q.replayed, 0),
    skipped: queues.reduce((n, q) => n + q.skipped, 0),
    busy: queues.reduce((n, q) => n + q.busy, 0),
    queues,
  };
}

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

/**
 * Move dead letters back into messages, ready now, with their ids kept and their counters reset, and wake
 * the workers of each queue. A dead letter whose id is already in messages stays where it is (reported as
 * skipped). `dryRun` reports the same numbers and changes nothing.
 *
 * Key by key, never waiting on a producer: a key whose lock a producer holds (its transaction is writing
 * that key) is left for another try, in a new statement after a short pause, while the other keys are
 * replayed at once; a key's dead letters always move together. Waiting for that lock while holding the
 * others could deadlock with a plain-SQL producer that takes its keys in another order. Keys still busy
 * after `busyTimeoutMs` stay dead letters, reported as `busy`. Each try is one statement: on a pool, one
 * transaction each; in the caller's transaction, the locks taken stay held until it ends.
 */
export async function replayDeadLetters(
  db: Executor,
  schema: string,
  filter: ReplayFilter,
  options: ReplayOptions = {},
): Promise<ReplayResult> {
  const names = outboxNames(schema);
  let params = replayParams(filter);
  const dryRun = options.dryRun === true;
  const busyTimeoutMs = options.busyTimeoutMs ?? DEFAULT_BUSY_TIMEOUT_MS;
  if (!Number.isFinite(busyTimeoutMs) || busyTimeoutMs < 0) {
    throw new OutboxConfigError(
      "busyTimeoutMs",
      `must be a number of milliseconds >= 0, got ${String(options.busyTimeoutMs)}`,
    );
  }
  const deadline = performance.now() + busyTimeoutMs;
  const queues = new Map<string, ReplayQueueCount>();
  for (let tries = 1; ; tries++) {
    const statement = dryRun ? previewReplayStatement(names) : replayDeadLettersStatement(names);
    const rows = await runQuery(db, statement, params);
    // Events kept for want of a subscriber go to their topic's subscribers of now, not to a queue.
    const routing = dryRun ? previewRouteUnroutedStatement(names) : routeUnroutedDeadLettersStatement(names);
    const routed = await runQuery(db, routing, params);
    addTry(queues, [...rows, ...routed]);
    const busy = [...rows, ...routed].flatMap((r) => r.busy_ids);
    if (busy.length === 0 || performance.now() >= deadline) break;
    // Their producers' transactions are short, as a rule: a pause, then only those ids again.
    const pause = Math.min(BUSY_PAUSE_MAX_MS, BUSY_PAUSE_MIN_MS * 2 ** Math.min(tries - 1, 10));
    await sleep(Math.min(pause * (0.5 + Math.random() / 2), Math.max(0, deadline - performance.now())));
    params = { ids: busy, queue: null, reason: null };
  }
  return replayResult(queues, dryRun);
}

/** Delete dead letters older than `olderThanMs` (by dead_at, server clock); `dryRun` only counts them. */
export async function purgeDeadLetters(
  db: Executor,
  schema: string,
  options: PurgeOptions,
): Promise<PurgeResult> {
  const names = outboxNames(schema);
  if (!Number.isFinite(options.olderThanMs) || options.olderThanMs <= 0) {
    throw new OutboxConfigError(
      "olderThanMs",
      `must be a positive number of milliseconds, got ${options.olderThanMs}`,
    );
  }
  const dryRun = options.dryRun === true;
  const rows = await runQuery(db, dryRun ? previewPurgeStatement(names) : purgeDeadLettersStatement(names), {
    olderThanMs: options.olderThanMs,
    queue: checkOptionalText(options.queue),
  });
  return { dryRun, purged: rows.reduce((n, r) => n + r.purged, 0), queues: rows };
}
