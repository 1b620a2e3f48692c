/**
 * A Kysely bound to a transactional handler's one connection, inside the transaction that acks its message.
 * Kysely's own `transaction()` would send BEGIN/COMMIT on that connection and commit the ack's transaction
 * early (the message's ack would then no longer be atomic with the writes): it is refused here.
 */

import {
  type DatabaseConnection,
  type Dialect,
  type Driver,
  Kysely,
  PostgresDialect,
  type PostgresPool,
  type PostgresPoolClient,
  type TransactionSettings,
} from "kysely";
import { OutboxError } from "./errors.js";
import type { MessageContext, TransactionClient } from "./handler.js";

const REFUSED =
  "the handler already runs inside the transaction that acknowledges its message: write with this Kysely directly (the worker commits it with the ack), not through db.transaction()";

/** Delegates to Kysely's Postgres driver; refuses to open a transaction of its own. */
class InTransactionDriver implements Driver {
  constructor(private readonly inner: Driver) {}
  init(): Promise<void> {
    return this.inner.init();
  }
  acquireConnection(): Promise<DatabaseConnection> {
    return this.inner.acquireConnection();
  }
  beginTransaction(_connection: DatabaseConnection, _settings: TransactionSettings): Promise<void> {
    return Promise.reject(new OutboxError(REFUSED));
  }
  commitTransaction(): Promise<void> {
    return Promise.reject(new OutboxError(REFUSED));
  }
  rollbackTransaction(): Promise<void> {
    return Promise.reject(new OutboxError(REFUSED));
  }
  releaseConnection(connection: DatabaseConnection): Promise<void> {
    return this.inner.releaseConnection(connection);
  }
  destroy(): Promise<void> {
    return this.inner.destroy();
  }
}

/** One connection as Kysely's pool: handed out every time, never released (the worker owns it). */
function onePool(client: TransactionClient): PostgresPool {
  const pooled: PostgresPoolClient = {
    query: client.query.bind(client) as PostgresPoolClient["query"],
    release: () => {},
  };
  return { connect: async () => pooled, end: async () => {} };
}

const cache = new WeakMap<TransactionClient, Kysely<unknown>>();

/**
 * A Kysely instance for a transactional handler (`transaction: true` or {@link handleInTransaction}): its
 * queries run on `message.transaction`, inside the transaction that acknowledges the message, so they
 * commit with the ack or not at all. Throws for a message of a queue that is not transactional.
 * `db.transaction()` on it is refused (the worker ends the transaction); `destroy()` does nothing.
 *
 * @example
 * ```ts
 * handleInTransaction(orderPlaced, async (order, message) => {
 *   await transactionKysely<Database>(message)
 *     .insertInto("invoices")
 *     .values({ order_id: order.orderId })
 *     .execute();
 * });
 * ```
 */
export function transactionKysely<DB>(message: Pick<MessageContext, "transaction" | "queue">): Kysely<DB> {
  const client = message.transaction;
  if (!client) {
    throw new OutboxError(
      `transactionKysely: queue "${message.queue}" does not run its handler in a transaction (set transaction: true, or use handleInTransaction)`,
    );
  }
  let db = cache.get(client);
  if (!db) {
    const postgres = new PostgresDialect({ pool: onePool(client) });
    const dialect: Dialect = {
      createAdapter: () => postgres.createAdapter(),
      createDriver: () => new InTransactionDriver(postgres.createDriver()),
      createIntrospector: (k) => postgres.createIntrospector(k),
      createQueryCompiler: () => postgres.createQueryCompiler(),
    };
    db = new Kysely<unknown>({ dialect });
    cache.set(client, db);
  }
  return db as Kysely<DB>;
}
