// The consumer inbox every example uses: one table in the receiving service's own database, keyed by
// (consumer, event source, event id). The handler's writes and the inbox record commit in one transaction,
// so an event delivered twice takes effect once.
import pg from "pg";
// In your project: import { createInbox, type Inbox } from "pg-outbox-worker/inbox".
import { createInbox, type Inbox } from "../../src/inbox/index.js";
import type { ReceivedEvent } from "./event.js";
import type { OrderPlaced } from "./types/order.placed.js";

/** The service's pool, its inbox (installed) and its effect table. */
export async function billingInbox(pool: pg.Pool, schema = "public"): Promise<Inbox<pg.PoolClient>> {
  const inbox = createInbox<pg.PoolClient>({ pool, consumer: "billing", schema });
  await inbox.install(); // or run inbox.installSql with your own migrations
  await pool.query(`CREATE TABLE IF NOT EXISTS "${schema}".billed_orders (
    order_id bigint NOT NULL, customer text NOT NULL, total_cents bigint NOT NULL,
    event_source text NOT NULL, event_id text NOT NULL)`);
  return inbox;
}

/** The effect: a row in the service's own table, written on the inbox's transaction client. */
export async function billOrder(event: ReceivedEvent<OrderPlaced>, client: pg.PoolClient, schema = "public") {
  const order = event.payload;
  await client.query(
    `INSERT INTO "${schema}".billed_orders (order_id, customer, total_cents, event_source, event_id) VALUES ($1, $2, $3, $4, $5)`,
    [order.orderId, order.customer, order.totalCents, event.source, event.id],
  );
}

/** The pool of DATABASE_URL (the receiving service's database, not the outbox's). */
export function poolFromEnv(): pg.Pool {
  return new pg.Pool({
    connectionString: process.env.DATABASE_URL ?? "postgres://postgres@127.0.0.1:5432/postgres",
  });
}
