import type pg from "pg";
import type { InboxRecord, InboxStore } from "../contract/inbox.js";
import { runQuery } from "../sql/executor.js";
import { inboxStatements } from "../sql/inbox.js";
import type { OutboxNames } from "../sql/names.js";

export interface PgInboxOptions {
  pool: () => pg.Pool;
  names: OutboxNames;
  synchronousCommit: boolean;
  queryTimeoutMs: number;
}

/** Most lookups one check statement carries. */
const MAX_CHECK_BATCH = 500;

interface Lookup {
  record: InboxRecord;
  resolve(seen: boolean): void;
  reject(error: unknown): void;
}

/**
 * The worker inbox on Postgres. Checks are batched the way acks are: the dispatch loops that ask while a
 * check is in flight wait for the next one, which asks for all of them in one statement. Idle, a delivery
 * pays one primary-key probe; busy, a statement covers many deliveries (one connection at a time).
 */
export function createPgInbox(options: PgInboxOptions): InboxStore {
  const sql = inboxStatements(options.names, { synchronousCommit: options.synchronousCommit });
  let waiting: Lookup[] = [];
  let checking = false;
  const run = <P, R>(query: Parameters<typeof runQuery<P, R>>[1], params: P) =>
    // Unnamed: they work behind a transaction-mode pooler from the first statement, and each carries a
    // batch, so planning it again costs little.
    runQuery(options.pool(), query, params, { timeoutMs: options.queryTimeoutMs });

  async function check(): Promise<void> {
    checking = true;
    try {
      while (waiting.length > 0) {
        const batch = waiting.slice(0, MAX_CHECK_BATCH);
        waiting = waiting.slice(batch.length);
        try {
          const rows = await run(sql.seen, {
            consumers: batch.map((l) => l.record.consumer),
            keys: batch.map((l) => l.record.key),
          });
          const found = new Set(rows.map((r) => pairKey(r.consumer, r.dedupe_key)));
          for (const l of batch) l.resolve(found.has(pairKey(l.record.consumer, l.record.key)));
        } catch (error) {
          for (const l of batch) l.reject(error);
        }
      }
    } finally {
      checking = false;
    }
  }

  return {
    seen(record) {
      return new Promise<boolean>((resolve, reject) => {
        waiting.push({ record, resolve, reject });
        // The first asker starts the check on the next tick, so loops asking in the same tick share it.
        if (!checking) {
          checking = true;
          setImmediate(() => void check());
        }
      });
    },
    async record(records) {
      await run(sql.record, {
        consumers: records.map((r) => r.consumer),
        keys: records.map((r) => r.key),
        ids: records.map((r) => r.id),
        queues: records.map((r) => r.queue),
      });
    },
  };
}

// A consumer name cannot hold NUL (a text column refuses it): a safe separator.
const pairKey = (consumer: string, key: string) => `${consumer}\0${key}`;
