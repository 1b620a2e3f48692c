import { type Kysely, sql, type Transaction } from "kysely";
import { OutboxConfigError } from "../contract/errors.js";
import type { Inbox, InboxKey, InboxResult } from "./inbox.js";

/**
 * {@link Inbox.handle} for Kysely: in one `db.transaction()`, inserts the event's record and, only when it
 * is new, runs `handler` with the transaction. A duplicate's transaction holds no write (the insert did
 * nothing), so committing it commits nothing. A handler that throws rolls back the record with its writes.
 * The inbox's own pool is not used: `db` must reach the database where `inbox.install()` made the table.
 */
export async function handleWithKysely<DB, E extends InboxKey, T>(
  inbox: Inbox,
  db: Kysely<DB>,
  event: E,
  handler: (event: E, trx: Transaction<DB>) => Promise<T> | T,
): Promise<InboxResult<T>> {
  for (const field of ["id", "source"] as const) {
    if (typeof event?.[field] !== "string" || event[field] === "") {
      throw new OutboxConfigError(`event.${field}`, "must be a non-empty string (the CloudEvents attribute)");
    }
  }
  return db.transaction().execute(async (trx) => {
    // As in Inbox.handle: a concurrent delivery's uncommitted record makes this wait, then conflict.
    const inserted = await sql`INSERT INTO ${sql.raw(inbox.table)} (consumer, source, event_id)
VALUES (${inbox.consumer}, ${event.source}, ${event.id}) ON CONFLICT DO NOTHING RETURNING 1`.execute(trx);
    if (inserted.rows.length === 0) return { duplicate: true } as const;
    return { duplicate: false, result: await handler(event, trx) } as const;
  });
}
