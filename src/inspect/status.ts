import { deadLetterAgesStatement } from "../sql/dead-letters.js";
import { type Executor, runQuery } from "../sql/executor.js";
import {
  type QueueStatusRow,
  queueStatusStatement,
  type WorkerLeasesRow as WorkerLeases,
  workerLeasesStatement,
} from "../sql/inspect.js";
import { outboxNames } from "../sql/names.js";

export type { WorkerLeasesRow as WorkerLeases } from "../sql/inspect.js";

/** One queue's counts by state, as `status` prints them and the metrics gauges export them. */
export interface QueueStatus extends QueueStatusRow {
  /**
   * Seconds since the queue's oldest dead letter died; null when it has none. With a dead-letter retention
   * on, it stays below the retention (plus a run's cadence): above it, the retention job is not keeping up.
   */
  oldest_dead_age_s: number | null;
}

/**
 * Per-queue ready / scheduled / leased / expired / dead counts, the oldest ready age and the oldest dead
 * letter's age: the backlog at a glance (what `outbox-worker status` prints). Lease-free; it scans the
 * backlog, so poll it every few seconds, not per message.
 *
 * @param db - a pg pool or client, or a Kysely instance
 * @param schema - the outbox schema, usually `"outbox"` ({@link DEFAULT_SCHEMA})
 */
export async function queueStatus(db: Executor, schema: string): Promise<QueueStatus[]> {
  const names = outboxNames(schema);
  // Two reads, one after the other (a Kysely instance or a client runs one at a time anyway); the ages
  // come from the (queue, dead_at) index alone.
  const rows = await runQuery(db, queueStatusStatement(names), {});
  const ages = await runQuery(db, deadLetterAgesStatement(names), {});
  const ageOf = new Map(ages.map((a) => [a.queue, a.oldest_dead_age_s]));
  return rows.map((row) => ({
    ...row,
    oldest_dead_age_s: row.dead > 0 ? (ageOf.get(row.queue) ?? null) : null,
  }));
}

/**
 * Per worker (acquired_by): rows it holds leases on, how many of those expired, its oldest lease. Expired
 * leases point at a stalled or dead worker.
 */
export async function workerLeases(db: Executor, schema: string): Promise<WorkerLeases[]> {
  return runQuery(db, workerLeasesStatement(outboxNames(schema)), {});
}
