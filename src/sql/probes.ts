import { defineQuery, type NoParams, type Query } from "./executor.js";
import type { OutboxNames } from "./names.js";

// Probes run once at start or every few seconds, on any connection: unnamed, not prepared.

export interface PingRow {
  ok: number;
}

/** The cheapest round trip: the server is up and takes queries (readiness, startup wait, embedded start). */
export const pingStatement: Query<NoParams, PingRow> = defineQuery("ping", "SELECT 1 AS ok", () => []);

export interface ServerStartedRow {
  /** When the postmaster started, as text (exact: compared, never computed with). */
  started: string;
}

/**
 * When the server answering started: a change says it restarted (a crash, a failover to another server)
 * and may have lost the last writes made with `synchronous_commit = off`.
 */
export const serverStartedStatement: Query<NoParams, ServerStartedRow> = defineQuery(
  "server_started",
  "SELECT pg_postmaster_start_time()::text AS started",
  () => [],
);

export interface MissingPrivilegesRow {
  /** "UPDATE on outbox.messages" and the like; empty when the user may do all the worker does. */
  missing: string[];
}

/**
 * The table privileges the worker's user lacks: SELECT, UPDATE, DELETE on messages and SELECT, INSERT,
 * UPDATE on dead_letters. has_table_privilege with a list answers "any of them", so one row per privilege.
 */
export function missingPrivilegesStatement(names: OutboxNames): Query<NoParams, MissingPrivilegesRow> {
  return defineQuery(
    "missing_privileges",
    `SELECT COALESCE(array_agg(p.priv || ' on ' || p.tbl) FILTER (WHERE NOT has_table_privilege(p.tbl, p.priv)), '{}') AS missing
FROM (VALUES ($1::text, 'SELECT'), ($1, 'UPDATE'), ($1, 'DELETE'),
             ($2::text, 'SELECT'), ($2, 'INSERT'), ($2, 'UPDATE')) AS p(tbl, priv)`,
    () => [names.messages, names.deadLetters],
  );
}

export interface NotifyParams {
  channel: string;
  payload: string;
}

/** One notification, outside any transaction of ours: the LISTEN connection's self-test. */
export const notifyStatement: Query<NotifyParams, unknown> = defineQuery(
  "notify",
  "SELECT pg_notify($1, $2)",
  (p) => [p.channel, p.payload],
);

export interface BackendPidRow {
  pid: number;
}

/** The server process answering: compared with the one a connection announced, it tells a pooler. */
export const backendPidStatement: Query<NoParams, BackendPidRow> = defineQuery(
  "backend_pid",
  "SELECT pg_backend_pid() AS pid",
  () => [],
);
