// Places an order every INTERVAL_MS: the order row and its outbox message in one transaction.
//   DATABASE_URL=postgres://... node examples/producer.js
import pg from "pg";
import { createPublisher } from "../dist/index.js";

const pool = new pg.Pool({ connectionString: process.env.DATABASE_URL });
const outbox = createPublisher({ notify: { connection: pool } });
const interval = Number(process.env.INTERVAL_MS ?? 1000);

await pool.query(
  "CREATE TABLE IF NOT EXISTS demo_orders (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, customer text NOT NULL, total_cents int NOT NULL)",
);
let stopping = false;
for (const signal of ["SIGTERM", "SIGINT"]) process.once(signal, () => (stopping = true));
for (let n = 1; !stopping; n++) {
  const client = await pool.connect();
  try {
    await client.query("BEGIN");
    const customer = `customer-${n % 5}`;
    const { rows } = await client.query(
      "INSERT INTO demo_orders (customer, total_cents) VALUES ($1, $2) RETURNING id",
      [customer, 1000 + n],
    );
    await outbox.publish(
      client,
      "order.placed",
      { orderId: Number(rows[0].id), customer, totalCents: 1000 + n },
      { key: customer },
    );
    await client.query("COMMIT");
  } catch (error) {
    await client.query("ROLLBACK").catch(() => {});
    console.error(error);
  } finally {
    client.release();
  }
  await new Promise((resolve) => setTimeout(resolve, interval));
}
await pool.end();
