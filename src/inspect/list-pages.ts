import { type Executor, runQuery } from "../sql/executor.js";
import {
  type DeadLetterPageRow,
  deadLetterPageStatement,
  getMessageStatement,
  type MessagePageRow,
  messagePageStatement,
} from "../sql/list-pages.js";
import { outboxNames } from "../sql/names.js";
import type { PeekRow } from "../sql/peek.js";
import { checkMessageId, type MessageId } from "./dead-letters.js";
import { checkLimit, checkOptionalText, checkState } from "./peek.js";

export type { DeadLetterPageRow, MessagePageRow } from "../sql/list-pages.js";

/** Characters of a payload or an error a list row carries: a 1 MB payload costs a list 200 characters. */
export const PREVIEW_CHARS = 200;

/** One page of a list and the cursor of the page after it (null: this is the last). */
export interface Page<Row> {
  rows: Row[];
  next: string | null;
}

/** Unprocessed messages in id order, from after the id `after` (exclusive). */
export interface MessagePageQuery {
  queue?: string;
  state?: string;
  after?: MessageId;
  limit?: number;
}

/** Dead letters, highest id first, from below the id `before` (exclusive). */
export interface DeadLetterPageQuery {
  queue?: string;
  reason?: string;
  before?: MessageId;
  limit?: number;
}

async function page<Row extends { id: string }>(
  fetch: (limit: number) => Promise<Row[]>,
  limit: number,
): Promise<Page<Row>> {
  // One row more than the page: whether a next page exists, without a count.
  const rows = await fetch(limit + 1);
  const more = rows.length > limit;
  const shown = more ? rows.slice(0, limit) : rows;
  return { rows: shown, next: more ? (shown[shown.length - 1]?.id ?? null) : null };
}

const cursor = (id: MessageId | undefined, field: string) =>
  id === undefined ? null : checkMessageId(id, field);

/** A page of the `unprocessed` view with payloads cut to a preview. Lease-free, like peek. */
export function messagePage(
  db: Executor,
  schema: string,
  query: MessagePageQuery = {},
): Promise<Page<MessagePageRow>> {
  const params = {
    queue: checkOptionalText(query.queue),
    kind: checkState(query.state),
    cursor: cursor(query.after, "after"),
    previewChars: PREVIEW_CHARS,
  };
  return page(
    (limit) => runQuery(db, messagePageStatement(outboxNames(schema)), { ...params, limit }),
    checkLimit(query.limit),
  );
}

/** A page of dead letters with payloads cut to a preview. Reads only. */
export function deadLetterPage(
  db: Executor,
  schema: string,
  query: DeadLetterPageQuery = {},
): Promise<Page<DeadLetterPageRow>> {
  const params = {
    queue: checkOptionalText(query.queue),
    kind: checkOptionalText(query.reason, "reason"),
    cursor: cursor(query.before, "before"),
    previewChars: PREVIEW_CHARS,
  };
  return page(
    (limit) => runQuery(db, deadLetterPageStatement(outboxNames(schema)), { ...params, limit }),
    checkLimit(query.limit),
  );
}

/** The unprocessed message with this id, whole (payload, headers, last error), or undefined. Lease-free. */
export async function getMessage(db: Executor, schema: string, id: MessageId): Promise<PeekRow | undefined> {
  const rows = await runQuery(db, getMessageStatement(outboxNames(schema)), { id: checkMessageId(id) });
  return rows[0];
}
