import type { PurgeResult, ReplayResult } from "../inspect/dead-letters.js";

/** Ids named in a write's log line; a longer list is counted, not copied (a body may hold thousands). */
const MAX_LOGGED_IDS = 20;

/**
 * What a replay or purge asked for and what it did, for its log line: the filter as sent (ids, queue,
 * reason, all, olderThan) and the counts per queue. Never a header: the token is not part of it.
 */
export function describeWrite(
  body: Record<string, unknown>,
  result: ReplayResult | PurgeResult,
): Record<string, unknown> {
  const asked: Record<string, unknown> = {};
  for (const field of ["queue", "reason", "olderThan", "all"]) {
    if (body[field] !== undefined) asked[field] = body[field];
  }
  if (Array.isArray(body.ids)) {
    asked.ids = body.ids.slice(0, MAX_LOGGED_IDS);
    if (body.ids.length > MAX_LOGGED_IDS) asked.idsCount = body.ids.length;
  }
  if ("replayed" in result) {
    return {
      asked,
      replayed: result.replayed,
      skipped: result.skipped,
      queues: result.queues.map((q) => ({ queue: q.queue, replayed: q.replayed, skipped: q.skipped })),
    };
  }
  return { asked, purged: result.purged, queues: result.queues };
}
