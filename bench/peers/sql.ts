/**
 * Pure-SQL ceilings on this project's table (same schema, same fill), with no worker in between: N
 * connections each loop until the queue is empty.
 *
 * - "lease-delete": ONE statement per round trip that picks 500 ready rows (the fetch's ready-branch
 *   predicate and order, SKIP LOCKED) and deletes them, returning their payloads. `head` is part of the
 *   predicate: since migration 0004 the only ready index is partial on it, and without it every round trip
 *   was a sequential scan and an on-disk sort of the whole backlog (the ceiling read 3x too low). Nothing is fenced: a crash loses
 *   the rows. The upper bound of any design on this table.
 * - "lease-ack": what the worker does without the worker: this project's fetch statement leases 500
 *   rows, then this project's ack statement deletes them by (id, lease token). Two round trips per 500.
 * Both on the worker's session settings (synchronous_commit off).
 */
import { randomUUID } from "node:crypto";
import pg from "pg";
import { completeStatements } from "../../src/sql/complete.js";
import { runQuery } from "../../src/sql/executor.js";
import { fetchStatement } from "../../src/sql/fetch.js";
import { outboxNames } from "../../src/sql/names.js";
import { DATABASE_URL } from "../lib.js";
import { QUEUE } from "./peer.js";

export type SqlVariant = "lease-delete" | "lease-ack";
export const SQL_BATCH = 500;

export async function sqlDrain(
  schema: string,
  variant: SqlVariant,
  connections: number,
  onRows: (count: number) => void,
): Promise<void> {
  const names = outboxNames(schema);
  const m = names.messages;
  const leaseDelete = {
    name: "bench_lease_delete",
    text: `DELETE FROM ${m} WHERE id = ANY (ARRAY(
  SELECT id FROM ${m}
  WHERE queue = $1 AND acquired_token IS NULL AND head AND available_at <= now()
  ORDER BY available_at, id LIMIT $2 FOR UPDATE SKIP LOCKED))
RETURNING id, payload`,
  };
  const fetch = fetchStatement(names, { synchronousCommit: false }, true);
  const { ack } = completeStatements(names, { synchronousCommit: false });
  const clients = await Promise.all(
    Array.from({ length: connections }, async () => {
      // The worker's statements carry its setting (synchronous_commit off), so the ceiling does its work.
      const c = new pg.Client({ connectionString: DATABASE_URL, application_name: "bench-sql" });
      await c.connect();
      return c;
    }),
  );
  try {
    await Promise.all(
      clients.map(async (c) => {
        // Bounded: every round trip removes rows until a lease finds none.
        for (;;) {
          if (variant === "lease-delete") {
            const { rows } = await c.query({ ...leaseDelete, values: [QUEUE, SQL_BATCH] });
            if (rows.length === 0) return;
            onRows(rows.length);
          } else {
            const token = randomUUID();
            const rows = await runQuery(
              c,
              fetch,
              { queues: [QUEUE], limit: SQL_BATCH, token, leaseTtlMs: 30_000, workerId: "bench-sql" },
              { prepared: true },
            );
            if (rows.length === 0) return;
            onRows(rows.length);
            const ids = rows.map((r) => r.id);
            const [gone] = await runQuery(
              c,
              ack,
              { ids, tokens: ids.map(() => token) },
              {
                prepared: true,
              },
            );
            if (gone?.deleted !== ids.length)
              throw new Error(`ack deleted ${gone?.deleted} of ${ids.length}`);
          }
        }
      }),
    );
  } finally {
    await Promise.all(clients.map((c) => c.end()));
  }
}
