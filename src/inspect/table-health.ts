import { type Executor, runQuery } from "../sql/executor.js";
import { type TableHealthRow as TableHealth, tableHealthStatement } from "../sql/inspect.js";
import { outboxNames } from "../sql/names.js";

export type { TableHealthRow as TableHealth } from "../sql/inspect.js";

/**
 * The messages table's dead tuples, size, last (auto)vacuum and whether autovacuum runs for it. Pickup
 * latency degrades as dead tuples pile up in the ready index; this is what to watch. Undefined when the
 * schema is not migrated.
 */
export async function tableHealth(db: Executor, schema: string): Promise<TableHealth | undefined> {
  const [row] = await runQuery(db, tableHealthStatement(outboxNames(schema)), {});
  return row;
}

/**
 * One line for people: "messages table: 12,034 dead tuples, 3 live, 2.1 MB, last vacuum 40 s ago,
 * autovacuum on, 99 % of 52,000 updates HOT".
 */
export function describeTableHealth(health: TableHealth, now = Date.now()): string {
  const last = health.last_autovacuum ?? health.last_vacuum;
  const vacuum = last ? `last vacuum ${ago(now - last.getTime())} ago` : "never vacuumed";
  const state = health.autovacuum_enabled ? "autovacuum on" : "AUTOVACUUM OFF";
  // Leases are meant to be HOT updates (no index entry): a low share means pages without room for them.
  const hot =
    health.updates > 0
      ? `, ${Math.floor((100 * health.hot_updates) / health.updates)} % of ${Math.round(health.updates).toLocaleString("en-US")} updates HOT`
      : "";
  return `messages table: ${Math.round(health.dead_tuples).toLocaleString("en-US")} dead tuples, ${Math.round(health.live_tuples).toLocaleString("en-US")} live, ${bytes(health.total_bytes)}, ${vacuum}, ${state}${hot}`;
}

function ago(ms: number): string {
  const s = Math.max(0, ms / 1000);
  if (s < 60) return `${Math.round(s)} s`;
  if (s < 3600) return `${Math.round(s / 60)} min`;
  if (s < 86_400) return `${Math.round(s / 3600)} h`;
  return `${Math.round(s / 86_400)} d`;
}

function bytes(n: number): string {
  if (n < 1024 * 1024) return `${Math.round(n / 1024)} kB`;
  if (n < 1024 ** 3) return `${(n / 1024 ** 2).toFixed(1)} MB`;
  return `${(n / 1024 ** 3).toFixed(1)} GB`;
}
