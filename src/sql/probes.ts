import { defineQuery, type NoParams, type Query } from "./executor.js";
import { describeRight, type Right, rightTarget } from "./grants.js";
import { outboxNames, quoteLiteral } from "./names.js";

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

/** The connected role's name. */
export const currentRoleStatement: Query<NoParams, { role: string }> = defineQuery(
  "current_role",
  "SELECT current_user::text AS role",
  () => [],
);

/** A right the connected role lacks, and the grant option that gives it. */
export interface MissingRightRow {
  /** The connected role (current_user), for the command that fixes it. */
  role: string;
  option: string;
  /** The right, as GRANT names it: `UPDATE (acquired_token, …) ON "outbox".messages`. */
  missing: string;
}

/** A right to check, with the grant option that gives it. */
export interface NeededRight {
  option: string;
  right: Right;
}

/**
 * The rights among `needed` that the connected role lacks (no rows: it has them all). Asked of the catalog
 * (has_*_privilege): nothing is read or written, so it works on an empty schema and behind any pooler. Each
 * check runs only when the role may use the schema (else name look-ups in it would fail).
 */
export function missingRightsStatement(
  schema: string,
  needed: readonly NeededRight[],
): Query<NoParams, MissingRightRow> {
  const s = quoteLiteral(outboxNames(schema).schema);
  const check = (right: Right): string => {
    const target = quoteLiteral(rightTarget(schema, right));
    const priv = quoteLiteral(right.privilege);
    if (right.kind === "schema") return `has_schema_privilege(${s}, ${priv})`;
    if (right.kind === "function")
      return `COALESCE(has_function_privilege(to_regprocedure(${target}), ${priv}), false)`;
    if (!right.columns) return `COALESCE(has_table_privilege(to_regclass(${target}), ${priv}), false)`;
    return right.columns
      .map(
        (c) => `COALESCE(has_column_privilege(to_regclass(${target}), ${quoteLiteral(c)}, ${priv}), false)`,
      )
      .join(" AND ");
  };
  const rows = needed.map(
    (n) =>
      `(${quoteLiteral(n.option)}, ${quoteLiteral(describeRight(schema, n.right))}, ${
        n.right.kind === "schema"
          ? check(n.right)
          : `CASE WHEN has_schema_privilege(${s}, 'USAGE') THEN ${check(n.right)} ELSE false END`
      })`,
  );
  if (rows.length === 0) rows.push("(NULL, NULL, true)");
  return defineQuery(
    "missing_rights",
    `SELECT current_user::text AS role, n.option, n.missing FROM (VALUES
${rows.join(",\n")}
) AS n(option, missing, ok) WHERE NOT n.ok`,
    () => [],
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
