import { OutboxConfigError, OutboxError } from "../contract/errors.js";
import { migrationState } from "../migrate/migrator.js";
import {
  type GrantPlan,
  grantScript,
  grantStatements,
  MISSING_ROLES,
  validateRoleName,
} from "../sql/grants.js";
import { migrationStatements } from "../sql/migrations.js";
import { DEFAULT_SCHEMA, outboxNames } from "../sql/names.js";
import { BEGIN, COMMIT, ROLLBACK } from "../sql/transaction.js";
import { parseCommandArgs, schemaFrom, UsageError, withDatabase } from "./args.js";
import { type CliIo, print } from "./io.js";

export const grantUsage = `Usage: outbox-worker grant [--producer ROLES] [--worker ROLES] [--inspector ROLES]
                          [--inspector-can-repair] [--worker-can-expire] [--worker-can-follow-up]
                          [--worker-can-subscribe] [--create]
                          [--schema NAME] [--database-url URL] [--print]

Give existing roles exactly the rights their side needs on the outbox schema (least privilege):
  producer    publish: INSERT into messages (its own columns), SELECT of id, queue and key; publish
              to topics (fan_out, topic_queues, copy_to_queues); no right on subscriptions
  worker      lease, ack, retry, dead-letter, release, renew, key-head repair, start-up checks;
              updates only lease and bookkeeping columns, writes dead letters only through
              dead_letter() (the row's own content); no DDL, no right on subscriptions
  inspector   status, peek, dead-letters list/show, subscriptions list (read only; no payload column
              of messages except through the unprocessed view, no lease token)
Subscribing and unsubscribing stay with the schema's owner (or a worker with --worker-can-subscribe,
which may add subscriptions only).
Each named role is first stripped of its rights on the schema's tables, functions and sequences, then
granted its side's; EXECUTE on the schema's functions is revoked from PUBLIC. Run it as the schema's
owner, on a schema migrated to this version, and again after every migrate. ROLES: one role name or
several, comma-separated.

Options:
  --producer ROLES         roles that publish
  --worker ROLES           roles that run the worker or relays
  --inspector ROLES        roles that inspect (status, peek, dead-letters list/show)
  --inspector-can-repair   inspectors may also replay and purge dead letters
  --worker-can-expire      workers may also expire old dead letters (deadLetterRetentionMs,
                           through expire_dead_letters())
  --worker-can-follow-up   workers may also insert messages (handlers that publish follow-ups)
  --worker-can-subscribe   workers may also add subscriptions (their queues' declared ones, at start);
                           never change or remove one
  --create                 create missing roles as NOLOGIN (no password: add LOGIN and a password yourself)
  --schema NAME            outbox schema (default: ${DEFAULT_SCHEMA}, or OUTBOX_SCHEMA)
  --database-url URL       Postgres connection string (default: DATABASE_URL)
  --print                  print the SQL instead of running it
  -h, --help               show this help`;

function roles(value: string | boolean | undefined, side: string): string[] {
  if (value === undefined) return [];
  const list = String(value)
    .split(",")
    .map((r) => r.trim());
  // Checked before anything connects or prints: a name is only ever spliced into SQL quoted and valid.
  return list.map((r) => validateRoleName(r, side));
}

export async function grantCommand(argv: string[], io: CliIo): Promise<number> {
  const { values, positionals } = parseCommandArgs(argv, {
    producer: { type: "string" },
    worker: { type: "string" },
    inspector: { type: "string" },
    "inspector-can-repair": { type: "boolean" },
    "worker-can-expire": { type: "boolean" },
    "worker-can-follow-up": { type: "boolean" },
    "worker-can-subscribe": { type: "boolean" },
    create: { type: "boolean" },
    schema: { type: "string" },
    "database-url": { type: "string" },
    print: { type: "boolean" },
  });
  if (values.help) {
    print(io, grantUsage);
    return 0;
  }
  if (positionals.length > 0) throw new UsageError(`unexpected argument ${JSON.stringify(positionals[0])}`);
  let plan: GrantPlan;
  try {
    plan = {
      schema: schemaFrom(values, io.env),
      producer: roles(values.producer, "producer"),
      worker: roles(values.worker, "worker"),
      inspector: roles(values.inspector, "inspector"),
      create: values.create === true,
      inspectorCanRepair: values["inspector-can-repair"] === true,
      workerCanExpire: values["worker-can-expire"] === true,
      workerCanFollowUp: values["worker-can-follow-up"] === true,
      workerCanSubscribe: values["worker-can-subscribe"] === true,
    };
  } catch (error) {
    if (error instanceof OutboxConfigError) throw new UsageError(error.message);
    throw error;
  }
  const named = [...(plan.producer ?? []), ...(plan.worker ?? []), ...(plan.inspector ?? [])];
  if (named.length === 0) throw new UsageError("name at least one role: --producer, --worker or --inspector");
  if (plan.inspectorCanRepair && (plan.inspector ?? []).length === 0) {
    throw new UsageError("--inspector-can-repair needs --inspector");
  }
  if (plan.workerCanExpire && (plan.worker ?? []).length === 0) {
    throw new UsageError("--worker-can-expire needs --worker");
  }
  if (plan.workerCanFollowUp && (plan.worker ?? []).length === 0) {
    throw new UsageError("--worker-can-follow-up needs --worker");
  }
  if (plan.workerCanSubscribe && (plan.worker ?? []).length === 0) {
    throw new UsageError("--worker-can-subscribe needs --worker");
  }
  if (values.print) {
    io.stdout(grantScript(plan));
    return 0;
  }
  return withDatabase(values, io.env, "outbox-grant", async (client, schema) => {
    if (!plan.create) {
      const { rows } = await client.query<{ missing: string[] }>(MISSING_ROLES, [named]);
      const missing = rows[0]?.missing ?? [];
      if (missing.length > 0) {
        throw new UsageError(`no such role: ${missing.join(", ")} (create it, or pass --create)`);
      }
    }
    // The rights name the functions the migrations create: on an older schema a GRANT would fail on the
    // first one missing, with Postgres' "does not exist" and no hint of the fix.
    const state = await migrationState({ connection: client, schema });
    if (!state.current) {
      const where =
        state.applied.length === 0
          ? "is not migrated"
          : `is older than this version (migrations ${state.pending.join(", ")} pending)`;
      throw new OutboxError(
        `schema "${schema}" ${where}: run \`outbox-worker migrate --schema ${schema}\` first, then grant`,
      );
    }
    // All or nothing: a role is never left stripped of its rights and not granted the new ones.
    await client.query(BEGIN.text);
    try {
      // Pods starting at once each run grant (deploy/kubernetes): two concurrent GRANTs on one table fail
      // with "tuple concurrently updated", so they take turns, and wait for a migration in progress.
      await client.query(migrationStatements(outboxNames(schema)).lockTransaction);
      for (const statement of grantStatements(plan)) await client.query(statement);
      await client.query(COMMIT.text);
    } catch (error) {
      await client.query(ROLLBACK.text).catch(() => {});
      throw error;
    }
    for (const [side, list] of [
      ["producer", plan.producer],
      ["worker", plan.worker],
      ["inspector", plan.inspector],
    ] as const) {
      for (const role of list ?? []) {
        const extras =
          side === "inspector"
            ? [plan.inspectorCanRepair && "repair"]
            : side === "worker"
              ? [
                  plan.workerCanExpire && "dead-letter expiry",
                  plan.workerCanFollowUp && "follow-ups",
                  plan.workerCanSubscribe && "subscribing",
                ]
              : [];
        const given = extras.filter(Boolean);
        const extra = given.length > 0 ? ` (with ${given.join(" and ")})` : "";
        print(io, `granted ${side} rights on schema "${schema}" to ${role}${extra}`);
      }
    }
    return 0;
  });
}
