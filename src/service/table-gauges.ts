import type pg from "pg";
import { tableHealth } from "../inspect/table-health.js";
import type { MetricMakers } from "./metric-makers.js";

/** The messages table's health (dead tuples, size, vacuum), from the database. */
export function createTableGauges(make: MetricMakers): (pool: pg.Pool, schema: string) => Promise<void> {
  const { gauge } = make;
  const table = {
    dead: gauge("outbox_table_dead_tuples", "Dead row versions in the messages table, not vacuumed yet.", []),
    bytes: gauge("outbox_table_size_bytes", "The messages table with its indexes and TOAST.", []),
    lastVacuum: gauge(
      "outbox_table_last_vacuum_timestamp_seconds",
      "When the messages table was last (auto)vacuumed, Unix time; 0 when never.",
      [],
    ),
    autovacuum: gauge(
      "outbox_table_autovacuum_enabled",
      "1 when autovacuum runs for the messages table.",
      [],
    ),
  };
  return async (pool, schema) => {
    const health = await tableHealth(pool, schema);
    if (!health) return;
    table.dead.set(health.dead_tuples);
    table.bytes.set(health.total_bytes);
    const last = health.last_autovacuum ?? health.last_vacuum;
    table.lastVacuum.set(last ? last.getTime() / 1000 : 0);
    table.autovacuum.set(health.autovacuum_enabled ? 1 : 0);
  };
}
