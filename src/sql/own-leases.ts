import { defineQuery, type Query } from "./executor.js";
import type { OutboxNames } from "./names.js";
import { type StatementSettings, withSettings } from "./settings.js";

export interface ReclaimParams {
  /** The worker's queues. */
  queues: readonly string[];
  /** Lease tokens this process made, as an array literal (`plainArray`). */
  tokens: string;
  /** The deliveries the process still holds, as parallel array literals: their rows are left alone. */
  heldIds: string;
  heldTokens: string;
}

export interface ReclaimedRow {
  id: string;
  /** The lease cleared: one of `tokens`. */
  token: string;
  queue: string;
}

/**
 * Clears the leases under `tokens` of rows for which no (id, token) of the held pairs is held: a server
 * crash undid the process's last outcome writes (`synchronous_commit = off`), so those rows came back under
 * a lease of its own that it no longer holds. Nothing would write for them again; without this they wait out
 * the lease TTL. Cleared as `release` clears, but deliveries_count is kept: the interrupted delivery counts
 * as one that ended without an outcome, as it would have at the TTL (it only goes up, DESIGN §4.6). Cleared,
 * not expired: an unleased row is due to every fetch, whatever leases the fetching worker keeps. Rows under
 * other tokens are never touched.
 *
 * Plan: the queues' rows (no index holds the lease columns: a lease is a HOT update, migration 0021; this
 * runs once after a server crash, not per fetch), filtered by the tokens through a hash; the held pairs are taken away by a hashed EXCEPT (an anti-join on the unnest was planned
 * as a nested loop: 1.3 s for 1,500 held pairs against 1,500 candidates). The stale rows are then locked by
 * primary key in id order, as every statement of the worker locks them (no deadlock), checked again, and
 * cleared by primary key.
 */
export function reclaimStatement(
  names: OutboxNames,
  settings: StatementSettings,
): Query<ReclaimParams, ReclaimedRow> {
  const m = names.messages;
  return defineQuery(
    "reclaim",
    `${withSettings(settings, true)}stale AS (
  SELECT t.id, t.acquired_token FROM ${m} AS t
  WHERE t.queue = ANY ($1::text[]) AND t.acquired_token IS NOT NULL
    AND t.acquired_token IN (SELECT unnest($2::uuid[]))
  EXCEPT
  SELECT h.id, h.token FROM unnest($3::bigint[], $4::uuid[]) AS h(id, token)
), locked AS (
  SELECT t.id, t.acquired_token FROM ${m} AS t
  WHERE t.id = ANY (ARRAY(SELECT id FROM stale)) AND t.acquired_token IN (SELECT unnest($2::uuid[]))
  ORDER BY t.id
  FOR UPDATE OF t
), cleared AS (
  UPDATE ${m} AS t
  SET acquired_token = NULL, acquired_at = NULL, lease_expires_at = NULL, acquired_by = NULL${settings.synchronousCommit ? "" : "\n  FROM settings"}
  WHERE t.id = ANY (ARRAY(SELECT id FROM locked))
  RETURNING t.id, t.queue
)
-- The token the lease had, from before the update (RETURNING sees the cleared row).
SELECT c.id::text AS id, l.acquired_token::text AS token, c.queue FROM cleared AS c JOIN locked AS l ON l.id = c.id`,
    (p) => [p.queues, p.tokens, p.heldIds, p.heldTokens],
  );
}
