import { type Executor, run } from "../sql/executor.js";
import { type QueueStatusRow, queueStatusSql } from "../sql/inspect.js";
import { outboxNames } from "../sql/names.js";

export type QueueStatus = QueueStatusRow;

/** Per-queue ready / scheduled / leased / expired / dead counts and the oldest ready age. Lease-free. */
export async function queueStatus(db: Executor, schema: string): Promise<QueueStatus[]> {
  const sql = queueStatusSql(outboxNames(schema));
  return run<QueueStatus>(db, { name: "", text: sql }, []);
}
