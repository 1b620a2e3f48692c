import { OutboxConfigError } from "../contract/errors.js";
import { outboxNames, quoteLiteral } from "./names.js";

/**
 * The rights of the three sides of an outbox, as GRANT/REVOKE statements (pure: no connection). Each right
 * is here because an operation of that side fails without it (test/grant.test.ts shows each one).
 *
 * - producer: INSERT of the columns `publish` writes, SELECT of `id` (for `RETURNING id`) and of
 *   `queue`/`key`, which the key-head trigger (mark_key_head, SECURITY INVOKER) reads as the inserting role.
 *   Not SECURITY DEFINER: a migration's CREATE OR REPLACE would silently drop it, and the grant command would
 *   have to alter a function it does not own. The cost: a producer can list other rows' queue and key (never
 *   their payloads, headers or errors). Topics: EXECUTE on fan_out (publishToTopic, and the expand_topic
 *   trigger of a plain-SQL row, which calls it as the inserting role), INSERT of `topic` (that row), EXECUTE
 *   on topic_queues (the trailing wake-up of a publisher with its own notify connection). Both functions are
 *   SECURITY DEFINER: no right on subscriptions or dead_letters. topic_queues tells a producer nothing fan_out
 *   does not (its copies name their queues, even in a transaction rolled back).
 * - worker: lease, ack, retry, release, renew and the dead-letter move (messages SELECT/UPDATE/DELETE,
 *   dead_letters SELECT/INSERT/UPDATE: UPDATE for the upsert of a replayed message that dies again), EXECUTE
 *   on ack_keyed/ack_key_heads/promote_heads/promote_heads_after, schema_migrations SELECT for the version check. No INSERT, no DDL, no TRUNCATE.
 *   With expire: DELETE on dead_letters, for the service's dead-letter retention (its FOR UPDATE SKIP LOCKED
 *   is covered by the UPDATE the worker already has). With follow-up: INSERT of the producer's columns, for
 *   handlers that publish follow-up messages (inserted by the worker with its ack; not `topic`, nor fan_out:
 *   follow-ups go to queues). With subscribe: INSERT and SELECT of subscriptions' (pattern, queue) (the
 *   ON CONFLICT (pattern, queue) of an idempotent subscribe reads its arbiter columns) and EXECUTE on
 *   topic_matcher (the generated `matcher` column calls it as the inserting role); no UPDATE or DELETE.
 * - inspector: the `unprocessed` view (peek; a view reads its table with its owner's rights), the columns of
 *   messages that `status` and the replay preview read (no payload, headers or error), dead_letters SELECT,
 *   subscriptions SELECT (who receives what), EXECUTE on topic_queues (the preview of kept topic events).
 *   With repair: replay (INSERT into messages with the dead letter's own id, DELETE from dead_letters; its
 *   FOR UPDATE needs UPDATE on one column; EXECUTE on route_unrouted, SECURITY DEFINER, for the events kept
 *   for want of a subscriber) and purge (DELETE).
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
/** A plain-SQL producer's row for a topic: expanded by fan_out through a trigger, never stored. */
export const PRODUCER_TOPIC_COLUMNS = ["topic"] as const;
/** publishToTopic and the topic row's trigger (fan_out); the trailing wake-up of a topic (topic_queues). */
export const PRODUCER_FUNCTIONS = ["fan_out(text, jsonb, boolean)", "topic_queues(text)"] as const;
/** What `status` (queue counts, worker leases) and the replay preview (`id`) read of messages. */
export const INSPECTOR_SELECT_COLUMNS = [
  "id",
  "queue",
  "head",
  "available_at",
  "acquired_at",
  "acquired_token",
  "acquired_by",
  "lease_expires_at",
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
export const INSPECTOR_FUNCTIONS = ["topic_queues(text)"] as const;
/** Replay fans kept topic events out to their subscribers of now. */
export const REPAIR_FUNCTIONS = ["route_unrouted(bigint[])"] as const;
/** What an idempotent subscribe writes, and reads as its ON CONFLICT arbiter. */
export const SUBSCRIBE_COLUMNS = ["pattern", "queue"] as const;
/** The generated `matcher` column of a new subscription calls it as the inserting role. */
export const SUBSCRIBE_FUNCTIONS = ["topic_matcher(text)"] as const;

/** The functions the worker calls (argument types, as Postgres names them). */
export const WORKER_FUNCTIONS = [
  "ack_keyed(bigint[], uuid[], integer, uuid, double precision, text, boolean)",
  "ack_key_heads(bigint[], uuid[], text[], text[], integer, uuid, double precision, text, boolean)",
  "promote_heads(text[], text[], integer, uuid, double precision, text)",
  "promote_heads_after(text[], text[], bigint[], integer, uuid, double precision, text)",
  // The replay preview (`dead-letters replay --dry-run`, the console's) asks where kept topic events would
  // go: queue names only, which the worker reads in every message already.
  "topic_queues(text)",
] as const;

const cols = (columns: readonly string[]) => columns.join(", ");
const quoteRole = (role: string) => `"${validateRoleName(role)}"`;

/**
 * The statements that give each named role exactly its side's rights on the schema's objects, in order, to
 * run in one transaction (or print). Every role named is first stripped of its rights on the schema's tables,
 * functions and sequences, so a re-run with other options takes away what they no longer give; all
 * revokes come before all grants, so a role named for two sides keeps both. Idempotent: run it again
 * after every migration (new functions start with PUBLIC EXECUTE and no grant).
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
  for (const role of all) out.push(`GRANT USAGE ON SCHEMA ${s} TO ${quoteRole(role)}`);
  for (const role of sides.producer) {
    const r = quoteRole(role);
    out.push(
      `GRANT INSERT (${cols([...PRODUCER_INSERT_COLUMNS, ...PRODUCER_TOPIC_COLUMNS])}) ON ${names.messages} TO ${r}`,
    );
    out.push(`GRANT SELECT (${cols(PRODUCER_SELECT_COLUMNS)}) ON ${names.messages} TO ${r}`);
    for (const fn of PRODUCER_FUNCTIONS) out.push(`GRANT EXECUTE ON FUNCTION ${s}.${fn} TO ${r}`);
  }
  for (const role of sides.worker) {
    const r = quoteRole(role);
    out.push(`GRANT SELECT, UPDATE, DELETE ON ${names.messages} TO ${r}`);
    out.push(`GRANT SELECT, INSERT, UPDATE ON ${names.deadLetters} TO ${r}`);
    out.push(`GRANT SELECT ON ${names.migrationsTable} TO ${r}`);
    for (const fn of WORKER_FUNCTIONS) out.push(`GRANT EXECUTE ON FUNCTION ${s}.${fn} TO ${r}`);
    // Retention is off by default: without it, a worker has no reason to destroy dead letters.
    if (plan.workerCanExpire) out.push(`GRANT DELETE ON ${names.deadLetters} TO ${r}`);
    // Only handlers that publish follow-ups need it; without them a worker never creates messages.
    if (plan.workerCanFollowUp)
      out.push(`GRANT INSERT (${cols(PRODUCER_INSERT_COLUMNS)}) ON ${names.messages} TO ${r}`);
    // Only a worker that applies its queues' declared subscriptions; add-only (no UPDATE, no DELETE).
    if (plan.workerCanSubscribe) {
      const c = cols(SUBSCRIBE_COLUMNS);
      out.push(`GRANT INSERT (${c}), SELECT (${c}) ON ${names.subscriptions} TO ${r}`);
      for (const fn of SUBSCRIBE_FUNCTIONS) out.push(`GRANT EXECUTE ON FUNCTION ${s}.${fn} TO ${r}`);
    }
  }
  for (const role of sides.inspector) {
    const r = quoteRole(role);
    out.push(`GRANT SELECT ON ${names.unprocessed} TO ${r}`);
    out.push(`GRANT SELECT (${cols(INSPECTOR_SELECT_COLUMNS)}) ON ${names.messages} TO ${r}`);
    out.push(`GRANT SELECT ON ${names.deadLetters} TO ${r}`);
    out.push(`GRANT SELECT ON ${names.subscriptions} TO ${r}`);
    for (const fn of INSPECTOR_FUNCTIONS) out.push(`GRANT EXECUTE ON FUNCTION ${s}.${fn} TO ${r}`);
    if (plan.inspectorCanRepair) {
      out.push(`GRANT INSERT (${cols(REPAIR_INSERT_COLUMNS)}) ON ${names.messages} TO ${r}`);
      out.push(`GRANT SELECT (${cols(REPAIR_SELECT_COLUMNS)}) ON ${names.messages} TO ${r}`);
      // Replay locks the dead letters it moves (FOR UPDATE), which takes UPDATE on some column.
      out.push(`GRANT DELETE, UPDATE (error) ON ${names.deadLetters} TO ${r}`);
      for (const fn of REPAIR_FUNCTIONS) out.push(`GRANT EXECUTE ON FUNCTION ${s}.${fn} TO ${r}`);
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
