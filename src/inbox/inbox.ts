import { OutboxConfigError } from "../contract/errors.js";
import {
  type InboxClient,
  type InboxOptions,
  type InboxPool,
  inboxOptionsSchema,
  parseOptions,
} from "./options.js";
import { expireBatchSql, inboxNames, insertRecordSql, installSql } from "./sql.js";

/** What the inbox needs of an event to dedupe it: its CloudEvents `id` and `source`. */
export interface InboxKey {
  id: string;
  source: string;
}

/** What {@link Inbox.handle} did: ran the handler (and committed) or found the event handled already. */
export type InboxResult<T> = { duplicate: false; result: T } | { duplicate: true };

/** What one {@link Inbox.expire} call deleted. */
export interface InboxExpiry {
  /** Records deleted. */
  deleted: number;
  /** Statements run, the last (short) one included. */
  batches: number;
}

/** A running expiry timer from {@link Inbox.startExpiry}. */
export interface InboxExpiryTimer {
  /** No more runs; waits for a run under way. */
  stop(): Promise<void>;
}

/** The consumer inbox: effects in the receiving service's database, at most once per event id. */
export interface Inbox<C extends InboxClient = InboxClient> {
  /** This inbox's consumer name (a table may hold several consumers' records). */
  readonly consumer: string;
  /** Records older than this are deleted by {@link Inbox.expire}. */
  readonly retentionMs: number;
  /** The inbox table, quoted and schema-qualified (`"public"."outbox_inbox"`), for your own queries. */
  readonly table: string;
  /** The DDL {@link Inbox.install} runs, for teams that run their own migrations. */
  readonly installSql: string;
  /** Creates the schema (unless `public`), the table and its index when missing. */
  install(): Promise<void>;
  /**
   * In one transaction on a client of the pool: inserts the event's record, and only when it is new, runs
   * `handler` with that client, then commits. A duplicate commits nothing and resolves `{ duplicate: true }`.
   * When the handler throws, the transaction rolls back (record included) and the error is rethrown, so the
   * transport redelivers. Do not BEGIN or COMMIT inside the handler: the inbox owns the transaction.
   */
  handle<E extends InboxKey, T>(
    event: E,
    handler: (event: E, client: C) => Promise<T> | T,
  ): Promise<InboxResult<T>>;
  /**
   * Deletes this consumer's records older than the retention, in batches of `batchSize` (default 500),
   * each its own short statement, until one batch comes back short.
   */
  expire(options?: { batchSize?: number }): Promise<InboxExpiry>;
  /** {@link Inbox.expire} every `intervalMs` (default 60 s); the timer does not hold the process open. */
  startExpiry(options?: {
    intervalMs?: number;
    batchSize?: number;
    onError?: (error: unknown) => void;
  }): InboxExpiryTimer;
}

/**
 * An inbox on the receiving service's own Postgres: a table keyed by (consumer, source, event id).
 * Options are checked at once; a bad one throws {@link OutboxConfigError} naming it.
 */
export function createInbox<C extends InboxClient>(options: InboxOptions<C>): Inbox<C> {
  const config = parseOptions(inboxOptionsSchema, options, "inbox");
  const pool = config.pool as InboxPool<C>;
  const names = inboxNames(config.schema, config.table);
  const insert = insertRecordSql(names);
  const expireBatch = expireBatchSql(names);
  const ddl = installSql(names);

  async function handle<E extends InboxKey, T>(
    event: E,
    handler: (event: E, client: C) => Promise<T> | T,
  ): Promise<InboxResult<T>> {
    for (const field of ["id", "source"] as const) {
      if (typeof event?.[field] !== "string" || event[field] === "") {
        throw new OutboxConfigError(
          `event.${field}`,
          "must be a non-empty string (the CloudEvents attribute)",
        );
      }
    }
    const client = await pool.connect();
    let broken: Error | undefined;
    try {
      await client.query("BEGIN");
      let committed = false;
      try {
        // Waits here while a concurrent delivery of the same event holds its uncommitted record; after
        // its commit, the conflict makes this a duplicate (after a rollback, this delivery runs instead).
        const inserted = await client.query(insert, [config.consumer, event.source, event.id]);
        if (inserted.rowCount === 0) {
          await client.query("ROLLBACK");
          committed = true;
          return { duplicate: true };
        }
        const result = await handler(event, client);
        await client.query("COMMIT");
        committed = true;
        return { duplicate: false, result };
      } finally {
        if (!committed) {
          await client.query("ROLLBACK").catch((error: unknown) => {
            // A client whose ROLLBACK failed is in an unknown state: the pool must not hand it out again.
            broken = error instanceof Error ? error : new Error(String(error));
          });
        }
      }
    } catch (error) {
      broken ??= isConnectionError(error) ? (error as Error) : undefined;
      throw error;
    } finally {
      client.release(broken);
    }
  }

  async function expire(opts: { batchSize?: number } = {}): Promise<InboxExpiry> {
    const batchSize = opts.batchSize ?? 500;
    if (!Number.isInteger(batchSize) || batchSize < 1 || batchSize > 100_000) {
      throw new OutboxConfigError("batchSize", "must be an integer from 1 to 100000");
    }
    let deleted = 0;
    let batches = 0;
    for (;;) {
      const { rowCount } = await pool.query(expireBatch, [config.consumer, config.retentionMs, batchSize]);
      batches++;
      deleted += rowCount ?? 0;
      if ((rowCount ?? 0) < batchSize) return { deleted, batches };
    }
  }

  function startExpiry(
    opts: { intervalMs?: number; batchSize?: number; onError?: (error: unknown) => void } = {},
  ): InboxExpiryTimer {
    const intervalMs = opts.intervalMs ?? 60_000;
    if (!Number.isInteger(intervalMs) || intervalMs < 1) {
      throw new OutboxConfigError("intervalMs", "must be a positive integer (milliseconds)");
    }
    let running: Promise<unknown> = Promise.resolve();
    let stopped = false;
    const timer = setInterval(() => {
      running = running.then(() =>
        stopped ? undefined : expire({ batchSize: opts.batchSize }).catch((error) => opts.onError?.(error)),
      );
    }, intervalMs);
    timer.unref();
    return {
      async stop() {
        stopped = true;
        clearInterval(timer);
        await running;
      },
    };
  }

  return {
    consumer: config.consumer,
    table: names.qualified,
    retentionMs: config.retentionMs,
    installSql: ddl,
    install: async () => {
      await pool.query(ddl);
    },
    handle,
    expire,
    startExpiry,
  };
}

/** A client that lost its connection (or whose query timed out) must be destroyed, not reused. */
function isConnectionError(error: unknown): boolean {
  if (!(error instanceof Error)) return false;
  const code = (error as { code?: unknown }).code;
  // SQLSTATE class 08: connection exception; 57P01..57P03: the server is going away.
  if (typeof code === "string") return code.startsWith("08") || /^57P0[1-3]$/.test(code);
  return /Connection terminated|Query read timeout/.test(error.message);
}
