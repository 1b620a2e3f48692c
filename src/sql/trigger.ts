import type { OutboxNames } from "./names.js";

const TRIGGER = "messages_notify_inserted";

/** DDL for the optional wake-up trigger (for producers that write plain SQL INSERTs). */
export function triggerStatements(names: OutboxNames) {
  return {
    drop: `DROP TRIGGER IF EXISTS ${TRIGGER} ON ${names.messages}`,
    // Statement-level with a transition table: one pg_notify per queue per INSERT statement, not per row.
    create: `CREATE TRIGGER ${TRIGGER} AFTER INSERT ON ${names.messages}
REFERENCING NEW TABLE AS inserted FOR EACH STATEMENT
EXECUTE FUNCTION ${names.quotedSchema}.notify_inserted()`,
    exists: `SELECT EXISTS (SELECT 1 FROM pg_trigger WHERE tgname = '${TRIGGER}' AND tgrelid = to_regclass('${names.messages.replaceAll("'", "''")}')) AS exists`,
  };
}
