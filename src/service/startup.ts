/**
 * What the service checks before it says it runs: a database no retry can make usable (authentication, a
 * missing database, an unmigrated schema, missing privileges) ends the start within seconds with one line;
 * a database that is not up yet is waited for, within `startupWaitMs`, with a progress line. After a good
 * start, outages are the worker's to retry.
 */
import type pg from "pg";
import type { Logger } from "pino";
import { MigrationError } from "../contract/errors.js";
import { describeTableHealth, tableHealth } from "../inspect/table-health.js";
import { migrationState } from "../migrate/migrator.js";
import { runQuery } from "../sql/executor.js";
import { type GrantOption, rightsOf } from "../sql/grants.js";
import { DEFAULT_SCHEMA, outboxNames } from "../sql/names.js";
import {
  currentRoleStatement,
  type MissingRightRow,
  missingRightsStatement,
  type NeededRight,
  pingStatement,
} from "../sql/probes.js";
import { scrubSecrets } from "../util/redact.js";

/** The service cannot start; the message is one line for the operator (no stack trace is useful). */
export class StartupError extends Error {
  override name = "StartupError";
}

/** SQLSTATEs that no retry fixes, with what to check. */
const PERMANENT: Readonly<Record<string, string>> = {
  "28P01": "authentication failed: check the user and password in DATABASE_URL",
  "28000":
    "the server refused this user (no such role, or not allowed to log in): check the user in DATABASE_URL",
  "3D000": "the database does not exist: check the database name in DATABASE_URL",
  "42501": "permission denied: the user lacks a privilege the worker needs",
};

/** Network errors and server states that mean "not up yet": worth waiting for, within the startup wait. */
const WAITABLE_CODES: ReadonlySet<string> = new Set([
  "ECONNREFUSED",
  "ECONNRESET",
  "ENOTFOUND", // a database host's name may resolve only once its container is up
  "EAI_AGAIN",
  "ETIMEDOUT",
  "EHOSTUNREACH",
  "ENETUNREACH",
  "EPIPE",
  "57P03", // cannot_connect_now: the database system is starting up
  "53300", // too_many_connections
]);

function codeOf(error: unknown): string | undefined {
  const code = (error as { code?: unknown } | null)?.code;
  return typeof code === "string" ? code : undefined;
}

function describe(error: unknown): string {
  const text = error instanceof Error ? error.message : String(error);
  // Node's dual-stack connect failure has an empty message; its code says it all.
  return scrubSecrets(text || codeOf(error) || "unknown error");
}

function waitable(error: unknown): boolean {
  const code = codeOf(error);
  if (code !== undefined) return WAITABLE_CODES.has(code);
  // pg's own connect timeout and a connection dropped during the handshake carry no code.
  return /timeout|terminated|ECONNREFUSED|ECONNRESET/i.test(error instanceof Error ? error.message : "");
}

export interface StartupCheckOptions {
  pool: pg.Pool;
  schema: string;
  /** How long a database that is not up yet is waited for; 0 fails at the first refused connection. */
  waitMs: number;
  log: Logger;
  sleep?: (ms: number) => Promise<void>;
}

/**
 * A connection that failed before any check could run (a CLI command connects once, without waiting): what
 * to check, in the words `run` uses.
 */
export function connectionFailure(error: unknown): StartupError {
  const code = codeOf(error);
  const permanent = code === undefined ? undefined : PERMANENT[code];
  if (permanent)
    return new StartupError(`cannot use the database: ${permanent} (${code}: ${describe(error)})`);
  return new StartupError(`cannot reach the database: ${describe(error)}`);
}

/** Wait (bounded) until the database answers; fail at once on what no retry fixes. */
export async function waitForDatabase(options: StartupCheckOptions): Promise<void> {
  const { pool, waitMs, log } = options;
  const sleep = options.sleep ?? ((ms: number) => new Promise<void>((r) => setTimeout(r, ms)));
  const started = Date.now();
  let lastProgress = 0;
  for (let attempt = 1; ; attempt++) {
    try {
      await runQuery(pool, pingStatement, {});
      if (attempt > 1) log.info({ waitedMs: Date.now() - started }, "the database is up");
      return;
    } catch (error) {
      const code = codeOf(error);
      const permanent = code === undefined ? undefined : PERMANENT[code];
      if (permanent)
        throw new StartupError(`cannot use the database: ${permanent} (${code}: ${describe(error)})`);
      if (!waitable(error)) throw new StartupError(`cannot use the database: ${describe(error)}`);
      const waited = Date.now() - started;
      if (waited >= waitMs) {
        throw new StartupError(
          `the database did not answer within the startup wait of ${waitMs} ms (startupWaitMs, OUTBOX_STARTUP_WAIT_MS): ${describe(error)}`,
        );
      }
      // A progress line every few seconds, not one per attempt.
      if (attempt === 1 || Date.now() - lastProgress >= 5000) {
        lastProgress = Date.now();
        log.warn(
          { attempt, waitedMs: waited, startupWaitMs: waitMs, error: describe(error) },
          "waiting for the database to come up",
        );
      }
      await sleep(Math.min(250 * 2 ** Math.min(attempt - 1, 3), Math.max(0, waitMs - waited)));
    }
  }
}

/** Who runs the checked work, for the messages: the service's role, or a person's at the CLI. */
export type CheckedSide = "worker" | "inspector";

/** Options of {@link checkSchema}. */
export interface SchemaCheckOptions {
  pool: pg.Pool | pg.Client;
  schema: string;
  /**
   * The grant options whose rights the work needs (default: `--worker`): each missing right fails the
   * check naming the option that gives it.
   */
  need?: readonly GrantOption[];
  /** Rights of one operation (a CLI command), with the option that gives them, beyond `need`. */
  needRights?: readonly NeededRight[];
  /**
   * Options the work may use without knowing it in advance (follow-ups): checked, never required; the
   * answer says which are missing, and the fix command keeps those held (a later grant replaces the role's).
   */
  optional?: readonly GrantOption[];
  /** How the command that fixes a schema not migrated is run (default: the service's words). */
  migrateHint?: string;
}

/** What {@link checkSchema} found beyond what it requires. */
export interface SchemaCheck {
  /** The connected role. */
  role: string;
  /** Of `optional`, the options whose rights the role lacks. */
  missingOptional: GrantOption[];
}

const SIDE_OF = (option: string): CheckedSide | "producer" =>
  option.startsWith("--worker") ? "worker" : option.startsWith("--inspector") ? "inspector" : "producer";

/** The `grant` command that gives `role` these options, the side's own first (one run per side). */
export function grantCommandFor(schema: string, role: string, options: readonly string[]): string {
  const sides = [...new Set(options.map(SIDE_OF))];
  const schemaArg = schema === DEFAULT_SCHEMA ? "" : ` --schema ${schema}`;
  return sides
    .map((side) => {
      const extras = [...new Set(options.filter((o) => SIDE_OF(o) === side && o !== `--${side}`))];
      return `outbox-worker grant --${side} ${role}${extras.map((o) => ` ${o}`).join("")}${schemaArg}`;
    })
    .join("` and `");
}

/**
 * The schema is migrated to this version and the connected role holds the rights of the work it is about
 * to do. Fails with the command that fixes it: `migrate`, or `grant` with the option that gives a missing
 * right. Shared by `run` and the inspection commands, so each says the same thing about the same problem.
 */
export async function checkSchema(options: SchemaCheckOptions): Promise<SchemaCheck> {
  const { pool, schema } = options;
  const need = options.need ?? ["--worker"];
  const needed: NeededRight[] = [
    ...need.flatMap((option) => rightsOf(option).map((right) => ({ option, right }))),
    ...(options.needRights ?? []),
  ];
  const optional = options.optional ?? [];
  const fix = `run \`outbox-worker migrate --schema ${schema}\` ${options.migrateHint ?? "with the same DATABASE_URL (or start with --migrate)"}`;
  const rights = async () => {
    const check = missingRightsStatement(schema, [
      ...needed,
      ...optional.flatMap((option) => rightsOf(option).map((right) => ({ option, right }))),
    ]);
    return runQuery(pool, check, {});
  };
  const refuse = (rows: MissingRightRow[]): StartupError => {
    const role = rows[0]?.role ?? "?";
    const missing = [
      ...new Set(rows.filter((r) => !optional.includes(r.option as GrantOption)).map((r) => r.missing)),
    ];
    const lacking = new Set(rows.map((r) => r.option));
    // Every option the work needs, and the optional ones the role holds: a grant run replaces the role's rights.
    const command = grantCommandFor(schema, role, [
      ...need,
      ...new Set(needed.map((n) => n.option)),
      ...optional.filter((o) => !lacking.has(o)),
    ]);
    const who = need.some((o) => SIDE_OF(o) === "worker") ? "the worker's user" : "the user";
    return new StartupError(
      `permission denied: ${who} (${role}) needs ${missing.join(" and ")}; as the schema's owner, run \`${command}\` (again after every migrate)`,
    );
  };
  let state: Awaited<ReturnType<typeof migrationState>>;
  try {
    state = await migrationState({ connection: pool, schema });
  } catch (error) {
    // Versions this package does not know, or a changed migration: not something to retry.
    if (error instanceof MigrationError) throw new StartupError(`schema "${schema}": ${describe(error)}`);
    const code = codeOf(error);
    // No USAGE on the schema or no SELECT on its version table: say which grant gives them.
    if (code === "42501") {
      const rows = await rights().catch(() => []);
      if (rows.some((r) => !optional.includes(r.option as GrantOption))) throw refuse(rows);
    }
    const permanent = code === undefined ? undefined : PERMANENT[code];
    if (permanent)
      throw new StartupError(`cannot read schema "${schema}": ${permanent} (${code}: ${describe(error)})`);
    throw error;
  }
  if (state.applied.length === 0) throw new StartupError(`schema "${schema}" is not migrated: ${fix}`);
  if (!state.current) {
    throw new StartupError(
      `schema "${schema}" is older than this version (migrations ${state.pending.join(", ")} pending): ${fix}`,
    );
  }
  const rows = await rights();
  if (rows.some((r) => !optional.includes(r.option as GrantOption))) throw refuse(rows);
  const missingOptional = optional.filter((o) => rows.some((r) => r.option === o));
  const role = rows[0]?.role ?? (await runQuery(pool, currentRoleStatement, {}))[0]?.role ?? "?";
  return { role, missingOptional };
}

/**
 * Every message leaves dead row versions; without autovacuum they pile up in the ready index and pickup
 * slows (measured here: p50 0.9 → 13.7 ms over 7 minutes at 300 msg/s). Said once, at start.
 */
export async function warnIfNotVacuumed(pool: pg.Pool, schema: string, log: Logger): Promise<void> {
  const health = await tableHealth(pool, schema);
  if (!health || health.autovacuum_enabled) return;
  log.warn(
    { table: outboxNames(schema).messages, health: describeTableHealth(health) },
    "autovacuum is off for the outbox table (server-wide or for the table): dead tuples will pile up and pickup slows; turn it on, or VACUUM the table often (see docs/operate/table-health.md)",
  );
}
