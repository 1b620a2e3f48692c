/** The demo's own orders table (`outbox-worker demo`), created in the database's current schema. */
export const CREATE_DEMO_ORDERS =
  "CREATE TABLE IF NOT EXISTS demo_orders (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, customer text NOT NULL, total_cents int NOT NULL, created_at timestamptz NOT NULL DEFAULT now())";

/** One order: `[customer, totalCents]` → its `id`. */
export const INSERT_DEMO_ORDER =
  "INSERT INTO demo_orders (customer, total_cents) VALUES ($1, $2) RETURNING id";

/** Where an unqualified table goes: the schema the demo's table is created in. */
export const CURRENT_SCHEMA = 'SELECT current_schema() AS "schema"';
