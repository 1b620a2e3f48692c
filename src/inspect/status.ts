import { type Executor, run } from "../sql/executor.js";
import {
  type QueueStatusRow,
  queueStatusSql,
  type WorkerLeasesRow,
  workerLeasesSql,
} from "../sql/inspect.js";
import { outboxNames } from "../sql/names.js";

export type QueueStatus = QueueStatusRow;

/** Per-queue ready / scheduled / leased / expired / dead counts and the oldest ready age. Lease-free. */
export async function queueStatus(db: Executor, schema: string): Promise<QueueStatus[]> {
  const sql = queueStatusSql(outboxNames(schema));
  return run<QueueStatus>(db, { name: "", text: sql }, []);
}

export type WorkerLeases = WorkerLeasesRow;

/** Per worker (acquired_by): rows it holds leases on, how many of those expired, its oldest lease. */
export async function workerLeases(db: Executor, schema: string): Promise<WorkerLeases[]> {
  return run<WorkerLeases>(db, { name: "", text: workerLeasesSql(outboxNames(schema)) }, []);
}
