import { OutboxConfigError } from "../contract/errors.js";
import { outboxNames, quoteLiteral } from "./names.js";

/**
 * The rights of the three sides of an outbox, as GRANT/REVOKE statements (pure: no connection). Each right
 * is here because an operation of that side fails without it (test/cli/grant.test.ts shows each one).
 *
 * - producer: INSERT of the columns `publish` writes, SELECT of `id` (for `RETURNING id`) and of
 *   `queue`/`key`, which the key-head trigger (mark_key_head, SECURITY INVOKER) reads as the inserting role.
 *   Not SECURITY DEFINER: a migration's CREATE OR REPLACE would silently drop it, and the grant command would
 *   have to alter a function it does not own. The cost: a producer can list other rows' queue and key (never
 *   their payloads, headers or errors). Topics: EXECUTE on fan_out (publishToTopic), INSERT of `topic` (a
 *   plain-SQL row), EXECUTE on topic_queues and copy_to_queues (that row's expand_topic trigger calls both
 *   as the inserting role; topic_queues is also the trailing wake-up of a publisher with its own notify
 *   connection). All three are SECURITY DEFINER: no right on subscriptions or dead_letters. topic_queues
 *   tells a producer nothing fan_out does not (its copies name their queues, even in a transaction rolled
 *   back); copy_to_queues writes nothing a producer could not (messages of queues it names, or the dead
 *   letter of a topic with no subscriber). Dedupe keys: INSERT and
 *   SELECT of `dedupe_key` (the ON CONFLICT arbiter, and the pending message's id read back), EXECUTE on
 *   cancel (SECURITY DEFINER: it deletes a pending, unleased message by dedupe key only; no DELETE).
 * - worker: lease, ack, retry, release, renew (messages SELECT, DELETE, and UPDATE of the lease and
 *   bookkeeping columns only: it cannot rewrite a payload, queue, key or headers), the dead-letter move
 *   through dead_letter (SECURITY DEFINER: it takes the content from the row the worker holds; the worker
 *   only reads dead_letters, so it cannot forge one) or dead_letter_announced (the same move, and a failure
 *   event built from the dead letter for a queue with announceFailures), EXECUTE on ack_keyed/ack_key_heads/promote_heads/
 *   promote_heads_after, schema_migrations SELECT for the version check, `leases` and batch_leased() for
 *   status, the inbox
 *   (SELECT and INSERT; its retention through expire_inbox, SECURITY DEFINER). No INSERT on messages, no
 *   DDL, no TRUNCATE. With expire: EXECUTE on expire_dead_letters (SECURITY DEFINER), for the service's
 *   dead-letter retention; no DELETE. With follow-up: INSERT of the producer's columns, for
 *   handlers that publish follow-up messages (inserted by the worker with its ack; not `topic`, nor fan_out:
 *   follow-ups go to queues). With subscribe: INSERT and SELECT of subscriptions' (pattern, queue) (the
 *   ON CONFLICT (pattern, queue) of an idempotent subscribe reads its arbiter columns) and EXECUTE on
 *   topic_matcher (the generated `matcher` column calls it as the inserting role); no UPDATE or DELETE.
 * - inspector: the `unprocessed` view (peek; a view reads its table with its owner's rights), the columns of
 *   messages that `status` and the replay preview read (no payload, headers, error or lease token), the
 *   `leases` view and batch_leased() (who holds what, without tokens), dead_letters SELECT, subscriptions SELECT (who receives
 *   what), inbox SELECT (what was handled), EXECUTE on topic_queues (the preview of kept topic events), schema_migrations SELECT (the version
 *   check every command runs first). With repair: replay (INSERT into messages with the dead letter's own
 *   id, DELETE from dead_letters; its FOR UPDATE needs UPDATE on one column; EXECUTE on route_unrouted,
 *   SECURITY DEFINER, for the events kept for want of a subscriber) and purge (DELETE).
 *
 * Nobody but the schema's owner changes subscriptions except a worker granted subscribe, and that adds only.
 */

/** The roles to grant to, by side; any subset. */
export interface GrantPlan {
  schema: string;
  producer?: readonly string[];
  worker?: readonly string[];
  inspector?: readonly string[];
  /** Create the roles that do not exist, as NOLOGIN (never with a password). */
  create?: boolean;
  /** The inspector may also replay and purge dead letters. */
  inspectorCanRepair?: boolean;
  /** The worker may also delete old dead letters (the service's deadLetterRetentionMs). */
  workerCanExpire?: boolean;
  /** The worker may also insert messages: its handlers' follow-ups, written with their ack. */
  workerCanFollowUp?: boolean;
  /** The worker may also add subscriptions (never change or remove one): the queues' declared ones, at start. */
  workerCanSubscribe?: boolean;
}

const ROLE_NAME = /^[a-z_][a-z0-9_]*$/;
// Names that are keywords in a role position or reserved by Postgres: quoting would not make them a role.
const RESERVED_ROLES = new Set(["public", "none", "current_user", "session_user", "current_role"]);

/** Of the role names `$1` (text[]), those with no role in the cluster, sorted: `missing`. */
export const MISSING_ROLES =
  "SELECT COALESCE(array_agg(r ORDER BY r), '{}') AS missing FROM unnest($1::text[]) AS r WHERE NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = r)";

/** Returns `name` if it can name a role here (as a schema name: lower-case, digits, `_`), else throws. */
export function validateRoleName(name: unknown, field = "role"): string {
  if (typeof name !== "string" || !ROLE_NAME.test(name)) {
    throw new OutboxConfigError(
      field,
      `${JSON.stringify(name)} is not a plain role name: use lower-case letters, digits and "_", starting with a letter or "_"`,
    );
  }
  if (Buffer.byteLength(name) > 63) throw new OutboxConfigError(field, `"${name}" is longer than 63 bytes`);
  if (name.startsWith("pg_") || RESERVED_ROLES.has(name)) {
    throw new OutboxConfigError(field, `"${name}" is reserved by Postgres`);
  }
  return name;
}

/** The columns `publish` (and a plain-SQL producer) writes: no lease, head, count or id of its own. */
export const PRODUCER_INSERT_COLUMNS = ["queue", "payload", "headers", "key", "available_at"] as const;
/** `id` for RETURNING; `queue` and `key` for the key-head trigger's look-up. */
export const PRODUCER_SELECT_COLUMNS = ["id", "queue", "key"] as const;
/**
 * A publish with a dedupe key writes it, and reads it back: the ON CONFLICT arbiter (queue, dedupe_key) and
 * the look-up of the pending message's id (migrations 0017, 0020). Not given to follow-ups (they refuse it).
 */
export const PRODUCER_DEDUPE_COLUMNS = ["dedupe_key"] as const;
/** A plain-SQL producer's row for a topic: expanded by a trigger (copy_to_queues), never stored. */
export const PRODUCER_TOPIC_COLUMNS = ["topic"] as const;
/**
 * publishToTopic (fan_out); the topic row's trigger (topic_queues, copy_to_queues); the trailing wake-up of a
 * topic (topic_queues).
 */
export const PRODUCER_FUNCTIONS = [
  "fan_out(text, jsonb, boolean)",
  "topic_queues(text)",
  "copy_to_queues(text, text[], jsonb, boolean)",
  // `cancel` by dedupe key (migration 0017), as the schema's owner: no DELETE on messages for producers.
  "cancel(text, text)",
] as const;
/**
 * What `status` (queue counts) and the replay preview (`id`) read of messages: no payload, headers or error,
 * and no lease token (acquired_at tells a lease; the `leases` view names its worker).
 */
export const INSPECTOR_SELECT_COLUMNS = [
  "id",
  "queue",
  "head",
  "available_at",
  "acquired_at",
  "lease_expires_at",
] as const;
/**
 * The lease and bookkeeping columns of messages the worker writes (lease, renew, release, retry, key-head
 * promotion and repair): never queue, payload, headers, key, created_at or topic.
 */
export const WORKER_UPDATE_COLUMNS = [
  "acquired_token",
  "acquired_at",
  "lease_expires_at",
  "acquired_by",
  "available_at",
  "deliveries_count",
  "attempts_count",
  "failures_count",
  "first_attempt_at",
  "last_attempt_at",
  "last_error",
  "head",
] as const;
/** The columns a replay writes back into messages (with the dead letter's own id). */
export const REPAIR_INSERT_COLUMNS = [
  "id",
  "queue",
  "payload",
  "headers",
  "key",
  "created_at",
  "available_at",
  "deliveries_count",
  "attempts_count",
  "failures_count",
  "last_error",
] as const;
/** The key-head trigger fires on a replay's keyed rows too and reads these (beyond the inspector's). */
export const REPAIR_SELECT_COLUMNS = ["key"] as const;
/** The replay preview counts the queues a kept topic event would reach now. */
export const INSPECTOR_FUNCTIONS = [
  "topic_queues(text)",
  // The rows transaction-held batches hold (migration 0024): status, peek and the leases view call it.
  "batch_leased()",
] as const;
/** Replay fans kept topic events out to their subscribers of now. */
export const REPAIR_FUNCTIONS = ["route_unrouted(bigint[])"] as const;
/** What an idempotent subscribe writes, and reads as its ON CONFLICT arbiter. */
export const SUBSCRIBE_COLUMNS = ["pattern", "queue"] as const;
/** The generated `matcher` column of a new subscription calls it as the inserting role. */
export const SUBSCRIBE_FUNCTIONS = ["topic_matcher(text)"] as const;
/** The dead-letter retention's batch (migration 0015), run as the schema's owner. */
export const EXPIRE_FUNCTIONS = ["expire_dead_letters(double precision, integer)"] as const;

/** The worker inbox's retention batch (migration 0016), run as the schema's owner. */
export const INBOX_EXPIRE_FUNCTIONS = ["expire_inbox(double precision, integer)"] as const;

/** The functions the worker calls (argument types, as Postgres names them). */
export const WORKER_FUNCTIONS = [
  "ack_keyed(bigint[], uuid[], integer, uuid, double precision, text, boolean)",
  "ack_key_heads(bigint[], uuid[], text[], text[], integer, uuid, double precision, text, boolean)",
  "promote_heads(text[], text[], integer, uuid, double precision, text)",
  "promote_heads_after(text[], text[], bigint[], integer, uuid, double precision, text)",
  // The dead-letter move (migration 0015), as the schema's owner: the row's own content, never the worker's.
  "dead_letter(bigint[], uuid[], text[], text[], integer[], integer[], integer, boolean)",
  // The same move publishing a failure event for queues with `announceFailures` (migration 0018), as the
  // owner: the event is built from the dead letter; the worker names only where it goes.
  "dead_letter_announced(bigint[], uuid[], text[], text[], integer[], integer[], integer, boolean, text[], text[], text)",
  // The replay preview (`dead-letters replay --dry-run`, the console's) asks where kept topic events would
  // go: queue names only, which the worker reads in every message anyway.
  "topic_queues(text)",
  // The rows transaction-held batches hold (migration 0024): status, the metrics' gauges, the unserved-queue
  // check and the leases view call it.
  "batch_leased()",
] as const;

/**
 * One right on the outbox schema or an object in it: what `grant` gives, and what the start-up checks ask
 * Postgres about (has_*_privilege), so the two never disagree.
 */
export interface Right {
  /** `table` covers views. */
  readonly kind: "schema" | "table" | "function";
  /** A table or view of the schema (`messages`), or a function's signature (`dead_letter(bigint[], …)`). */
  readonly object: string;
  readonly privilege: "USAGE" | "SELECT" | "INSERT" | "UPDATE" | "DELETE" | "EXECUTE";
  /** A column privilege on each of these, not one on the whole table. */
  readonly columns?: readonly string[];
}

/** The `outbox-worker grant` options, each a set of rights (the `-can-` ones on top of their side's). */
export type GrantOption =
  | "--producer"
  | "--worker"
  | "--worker-can-expire"
  | "--worker-can-follow-up"
  | "--worker-can-subscribe"
  | "--inspector"
  | "--inspector-can-repair";

const usage: Right = { kind: "schema", object: "", privilege: "USAGE" };
const table = (object: string, privilege: Right["privilege"], columns?: readonly string[]): Right =>
  columns ? { kind: "table", object, privilege, columns } : { kind: "table", object, privilege };
const fn = (object: string): Right => ({ kind: "function", object, privilege: "EXECUTE" });

/** The version check every command and the service run first (`migrationState`). */
export const VERSION_RIGHTS: readonly Right[] = [usage, table("schema_migrations", "SELECT")];

/** What each read-only operation needs, beyond the version check; the grant that gives it in the comment. */
export const READ_RIGHTS = {
  /** `status`, the console's and the metrics' counts (--worker or --inspector). */
  status: [
    table("messages", "SELECT", INSPECTOR_SELECT_COLUMNS),
    table("leases", "SELECT"),
    fn("batch_leased()"),
    table("dead_letters", "SELECT"),
  ],
  /** `peek`: the `unprocessed` view (--inspector). */
  peek: [table("unprocessed", "SELECT"), fn("batch_leased()")],
  /** `dead-letters list|show` (--worker or --inspector). */
  deadLetters: [table("dead_letters", "SELECT")],
  /** `dead-letters replay --dry-run` (--worker or --inspector). */
  replayPreview: [
    table("dead_letters", "SELECT"),
    table("messages", "SELECT", ["id"]),
    fn("topic_queues(text)"),
  ],
} as const satisfies Record<string, readonly Right[]>;

const RIGHTS: Readonly<Record<GrantOption, readonly Right[]>> = {
  "--producer": [
    usage,
    table("messages", "INSERT", [
      ...PRODUCER_INSERT_COLUMNS,
      ...PRODUCER_TOPIC_COLUMNS,
      ...PRODUCER_DEDUPE_COLUMNS,
    ]),
    table("messages", "SELECT", [...PRODUCER_SELECT_COLUMNS, ...PRODUCER_DEDUPE_COLUMNS]),
    ...PRODUCER_FUNCTIONS.map(fn),
  ],
  "--worker": [
    ...VERSION_RIGHTS,
    table("messages", "SELECT"),
    table("messages", "UPDATE", WORKER_UPDATE_COLUMNS),
    table("messages", "DELETE"),
    // Read only: the move writes dead letters as the schema's owner (dead_letter).
    table("dead_letters", "SELECT"),
    table("leases", "SELECT"),
    ...WORKER_FUNCTIONS.map(fn),
    // Transaction-held leases (migration 0023): a guard per batch, its repair after a crash.
    table("lease_guards", "SELECT"),
    table("lease_guards", "INSERT", ["ids", "xid", "worker", "alone"]),
    table("lease_guards", "UPDATE", ["ids", "alone"]),
    table("lease_guards", "DELETE"),
    // The inbox of queues configured with one (migration 0016): the check, the record, and its retention
    // (deletes through expire_inbox, as the owner: no DELETE). Only the worker's own bookkeeping.
    table("inbox", "SELECT"),
    table("inbox", "INSERT"),
    ...INBOX_EXPIRE_FUNCTIONS.map(fn),
  ],
  // Retention is off by default: without it, a worker has no reason to destroy dead letters.
  "--worker-can-expire": EXPIRE_FUNCTIONS.map(fn),
  // Only handlers that publish follow-ups need it; without them a worker never creates messages.
  "--worker-can-follow-up": [table("messages", "INSERT", PRODUCER_INSERT_COLUMNS)],
  // Only a worker that applies its queues' declared subscriptions; add-only (no UPDATE, no DELETE).
  "--worker-can-subscribe": [
    table("subscriptions", "INSERT", SUBSCRIBE_COLUMNS),
    table("subscriptions", "SELECT", SUBSCRIBE_COLUMNS),
    ...SUBSCRIBE_FUNCTIONS.map(fn),
  ],
  "--inspector": [
    ...VERSION_RIGHTS,
    table("unprocessed", "SELECT"),
    table("messages", "SELECT", INSPECTOR_SELECT_COLUMNS),
    table("leases", "SELECT"),
    table("dead_letters", "SELECT"),
    table("subscriptions", "SELECT"),
    // Which messages a queue's inbox holds as handled (a person asking why one was deduped).
    table("inbox", "SELECT"),
    ...INSPECTOR_FUNCTIONS.map(fn),
  ],
  "--inspector-can-repair": [
    table("messages", "INSERT", REPAIR_INSERT_COLUMNS),
    table("messages", "SELECT", REPAIR_SELECT_COLUMNS),
    table("dead_letters", "DELETE"),
    // Replay locks the dead letters it moves (FOR UPDATE), which takes UPDATE on some column.
    table("dead_letters", "UPDATE", ["error"]),
    ...REPAIR_FUNCTIONS.map(fn),
  ],
};

/** The rights one grant option gives (the `-can-` options: only what they add to their side's). */
export function rightsOf(option: GrantOption): readonly Right[] {
  return RIGHTS[option];
}

/** The object a right is on, quoted for SQL: the schema, `"s".messages`, `"s".dead_letter(bigint[], …)`. */
export function rightTarget(schema: string, right: Right): string {
  const s = outboxNames(schema).quotedSchema;
  return right.kind === "schema" ? s : `${s}.${right.object}`;
}

/** How a right reads in a message or a GRANT: `UPDATE (head, …) ON "s".messages`, `EXECUTE ON FUNCTION …`. */
export function describeRight(schema: string, right: Right): string {
  const what = right.columns ? `${right.privilege} (${right.columns.join(", ")})` : right.privilege;
  const on = right.kind === "schema" ? "SCHEMA " : right.kind === "function" ? "FUNCTION " : "";
  return `${what} ON ${on}${rightTarget(schema, right)}`;
}

const quoteRole = (role: string) => `"${validateRoleName(role)}"`;

/**
 * The statements that give each named role exactly its side's rights on the schema's objects, in order, to
 * run in one transaction (or print). Every role named is first stripped of its rights on the schema's tables,
 * functions and sequences, so a re-run with other options takes away what they no longer give; all
 * revokes come before all grants, so a role named for two sides keeps both. Idempotent: run it again
 * after every migration (new functions and views start without the grants of this version).
 */
export function grantStatements(plan: GrantPlan): string[] {
  const names = outboxNames(plan.schema);
  const s = names.quotedSchema;
  const sides = {
    producer: (plan.producer ?? []).map((r) => validateRoleName(r, "producer")),
    worker: (plan.worker ?? []).map((r) => validateRoleName(r, "worker")),
    inspector: (plan.inspector ?? []).map((r) => validateRoleName(r, "inspector")),
  };
  const all = [...new Set([...sides.producer, ...sides.worker, ...sides.inspector])];
  const out: string[] = [];
  if (plan.create) {
    for (const role of all) {
      // Created without LOGIN or password: those are the operator's, never printed or logged by us.
      out.push(`DO $$
BEGIN
  IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = ${quoteLiteral(role)}) THEN
    CREATE ROLE ${quoteRole(role)} NOLOGIN;
  END IF;
EXCEPTION WHEN duplicate_object THEN NULL; -- created by a concurrent run
END
$$`);
    }
  }
  // EXECUTE is granted to PUBLIC on every new function: anyone who can reach the schema could call
  // ack_keyed and delete leased rows (as far as their table rights go). Trigger functions still fire.
  out.push(`REVOKE ALL ON ALL FUNCTIONS IN SCHEMA ${s} FROM PUBLIC`);
  for (const role of all) {
    const r = quoteRole(role);
    out.push(`REVOKE ALL ON ALL TABLES IN SCHEMA ${s} FROM ${r}`);
    out.push(`REVOKE ALL ON ALL SEQUENCES IN SCHEMA ${s} FROM ${r}`);
    out.push(`REVOKE ALL ON ALL FUNCTIONS IN SCHEMA ${s} FROM ${r}`);
  }
  const options: [readonly string[], GrantOption, boolean | undefined][] = [
    [sides.producer, "--producer", true],
    [sides.worker, "--worker", true],
    [sides.worker, "--worker-can-expire", plan.workerCanExpire],
    [sides.worker, "--worker-can-follow-up", plan.workerCanFollowUp],
    [sides.worker, "--worker-can-subscribe", plan.workerCanSubscribe],
    [sides.inspector, "--inspector", true],
    [sides.inspector, "--inspector-can-repair", plan.inspectorCanRepair],
  ];
  for (const [roles, option, given] of options) {
    if (!given) continue;
    for (const role of roles) {
      for (const right of RIGHTS[option]) {
        out.push(`GRANT ${describeRight(plan.schema, right)} TO ${quoteRole(role)}`);
      }
    }
  }
  return out;
}

/** The statements as one script, each ending with `;`. */
export function grantScript(plan: GrantPlan): string {
  return `${grantStatements(plan)
    .map((statement) => `${statement};`)
    .join("\n")}\n`;
}
