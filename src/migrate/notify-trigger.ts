import { type Executor, run, statement } from "../sql/executor.js";
import { DEFAULT_SCHEMA, outboxNames } from "../sql/names.js";
import { triggerStatements } from "../sql/trigger.js";

/**
 * Attach the wake-up trigger, so rows inserted by plain SQL wake workers at once instead of at the next
 * poll. Its price: every inserting transaction then notifies, and Postgres serialises the commits of
 * notifying transactions (see docs/guide/publishing.md for the measured cost). Publishers using `publish`
 * do not need it.
 */
export async function enableNotifyTrigger(db: Executor, schema: string = DEFAULT_SCHEMA): Promise<void> {
  const sql = triggerStatements(outboxNames(schema));
  // Drop-then-create is one idempotent step when the caller runs it inside a transaction.
  await run(db, { name: "", text: sql.drop }, []);
  await run(db, { name: "", text: sql.create }, []);
}

/** Remove the wake-up trigger of {@link enableNotifyTrigger}; idempotent. Workers then wake by polling. */
export async function disableNotifyTrigger(db: Executor, schema: string = DEFAULT_SCHEMA): Promise<void> {
  const sql = triggerStatements(outboxNames(schema));
  await run(db, { name: "", text: sql.drop }, []);
}

export async function isNotifyTriggerEnabled(
  db: Executor,
  schema: string = DEFAULT_SCHEMA,
): Promise<boolean> {
  const sql = triggerStatements(outboxNames(schema));
  const rows = await run<{ exists: boolean }>(db, statement("trigger_exists", sql.exists), []);
  return rows[0]?.exists === true;
}
