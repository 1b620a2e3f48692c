import { type Executor, runQuery } from "../sql/executor.js";
import {
  type QueueStatusRow as QueueStatus,
  queueStatusStatement,
  type WorkerLeasesRow as WorkerLeases,
  workerLeasesStatement,
} from "../sql/inspect.js";
import { outboxNames } from "../sql/names.js";

export type { QueueStatusRow as QueueStatus, WorkerLeasesRow as WorkerLeases } from "../sql/inspect.js";

/**
 * Per-queue ready / scheduled / leased / expired / dead counts, the oldest ready age and the oldest dead
 * letter's age: the backlog at a glance (what `outbox-worker status` prints). Lease-free; it scans the
 * backlog, so poll it every few seconds, not per message.
 *
 * @param db - a pg pool or client, or a Kysely instance
 * @param schema - the outbox schema, usually `"outbox"` ({@link DEFAULT_SCHEMA})
 */
export async function queueStatus(db: Executor, schema: string): Promise<QueueStatus[]> {
  return runQuery(db, queueStatusStatement(outboxNames(schema)), {});
}

/**
 * Per worker (acquired_by): rows it holds leases on, how many of those expired, its oldest lease. Expired
 * leases point at a stalled or dead worker.
 */
export async function workerLeases(db: Executor, schema: string): Promise<WorkerLeases[]> {
  return runQuery(db, workerLeasesStatement(outboxNames(schema)), {});
}
