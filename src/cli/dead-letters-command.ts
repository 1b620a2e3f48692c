import { parseArgs } from "node:util";
import {
  type DeadLetter,
  getDeadLetter,
  listDeadLetters,
  purgeDeadLetters,
  type ReplayFilter,
  replayDeadLetters,
} from "../inspect/dead-letters.js";
import { MAX_LIMIT } from "../inspect/peek.js";
import { DEFAULT_SCHEMA } from "../sql/names.js";
import { parseDuration as parseAge } from "../util/duration.js";
import { checkCommandLine, parseCommandArgs, UsageError } from "./args.js";
import { COMMAND_NEEDS, withCheckedDatabase } from "./checked-database.js";
import { cell, formatAge, jsonCell, printJson, renderTable, safeText } from "./format.js";
import { type CliIo, print, printError } from "./io.js";
import { parseLimit } from "./peek-command.js";

export const deadLettersUsage = `Usage: outbox-worker dead-letters list|show|replay|purge [options]

  dead-letters list [--queue Q] [--reason R] [--limit N] [--json]
      Dead letters, most recently dead first, at most N (1 to ${MAX_LIMIT}, default 20). The table cuts
      payloads and errors; --json prints them whole.
  dead-letters show ID [--json]
      One dead letter with everything: headers, full payload and full error.
  dead-letters replay (--id ID... | --queue Q | --reason R | --all) [--dry-run]
      Move dead letters back into the outbox in one transaction: same ids, counters reset, deliverable
      now, last error kept; the workers of each queue are woken. --id can be repeated or given a
      comma-separated list; filters combine (all must match). Without a filter it refuses: --all is
      needed to replay everything. A dead letter whose id is already in the outbox is left where it is
      and reported (exit 1).
  dead-letters purge --older-than AGE [--queue Q] [--dry-run]
      Delete dead letters that died more than AGE ago: a whole number and a unit s, m, h or d
      (30m, 12h, 7d).

Options for every subcommand:
  --schema NAME        outbox schema (default: ${DEFAULT_SCHEMA}, or OUTBOX_SCHEMA)
  --database-url URL   Postgres connection string (default: DATABASE_URL)
  --dry-run            (replay, purge) print what would change and change nothing
  -h, --help           show this help`;

const CONNECTION_OPTIONS = {
  schema: { type: "string" },
  "database-url": { type: "string" },
} as const;

function noPositionals(positionals: string[]): void {
  if (positionals.length > 0) throw new UsageError(`unexpected argument ${JSON.stringify(positionals[0])}`);
}

function parseId(text: string, flag: string): string {
  if (!/^[1-9][0-9]{0,18}$/.test(text) || BigInt(text) > 9223372036854775807n) {
    throw new UsageError(
      `${flag} must be a message id (a positive whole number), got ${JSON.stringify(text)}`,
    );
  }
  return text;
}

/** --older-than: a positive whole number and one unit, nothing else ("7d", "12h", "30m", "90s"). */
export function parseDuration(text: string, flag = "--older-than"): number {
  try {
    return parseAge(text, flag);
  } catch (error) {
    throw new UsageError((error as Error).message);
  }
}

function count(n: number): string {
  return `${n} dead letter${n === 1 ? "" : "s"}`;
}

function byQueue(queues: readonly { queue: string; n: number }[]): string {
  const some = queues.filter((q) => q.n > 0);
  return some.length === 0 ? "" : ` (${some.map((q) => `queue ${cell(q.queue)}: ${q.n}`).join(", ")})`;
}

async function list(argv: string[], io: CliIo): Promise<number> {
  const { values, positionals } = parseCommandArgs(argv, {
    ...CONNECTION_OPTIONS,
    queue: { type: "string" },
    reason: { type: "string" },
    limit: { type: "string" },
    json: { type: "boolean" },
  });
  if (values.help) return help(io);
  noPositionals(positionals);
  const query = {
    queue: values.queue as string | undefined,
    reason: values.reason as string | undefined,
    limit: parseLimit(values.limit),
  };
  const needs = COMMAND_NEEDS.deadLetters;
  const rows = await withCheckedDatabase(values, io.env, "outbox-dead-letters", needs, (client, schema) =>
    listDeadLetters(client, schema, query),
  );
  if (values.json) printJson(io, rows);
  else if (rows.length === 0) print(io, "no dead letters");
  else print(io, deadLetterTable(rows));
  return 0;
}

function deadLetterTable(rows: readonly DeadLetter[]): string {
  return renderTable(
    [
      { header: "ID", align: "right" },
      { header: "QUEUE" },
      { header: "KEY" },
      { header: "REASON" },
      { header: "DEAD FOR", align: "right" },
      { header: "DELIVERIES", align: "right" },
      { header: "ATTEMPTS", align: "right" },
      { header: "ERROR" },
      { header: "PAYLOAD" },
    ],
    rows.map((r) => [
      r.id,
      cell(r.queue),
      cell(r.key, 24),
      r.reason,
      formatAge(r.dead_age_s),
      String(r.deliveries_count),
      String(r.attempts_count),
      cell(r.error, 40),
      jsonCell(r.payload, 60),
    ]),
  );
}

async function show(argv: string[], io: CliIo): Promise<number> {
  const { values, positionals } = parseCommandArgs(argv, {
    ...CONNECTION_OPTIONS,
    json: { type: "boolean" },
  });
  if (values.help) return help(io);
  const [raw, ...extra] = positionals;
  if (raw === undefined) throw new UsageError("show needs the id of a dead letter");
  noPositionals(extra);
  const id = parseId(raw, "ID");
  const needs = COMMAND_NEEDS.deadLetters;
  return withCheckedDatabase(values, io.env, "outbox-dead-letters", needs, async (client, schema) => {
    const row = await getDeadLetter(client, schema, id);
    if (!row) {
      printError(io, `outbox-worker dead-letters: no dead letter with id ${id} in schema "${schema}"`);
      return 1;
    }
    if (values.json) printJson(io, row);
    else print(io, describe(row));
    return 0;
  });
}

function describe(r: DeadLetter): string {
  const time = (d: Date | null) => (d ? d.toISOString() : "-");
  const fields: [string, string][] = [
    ["id", r.id],
    ["queue", cell(r.queue)],
    ["key", cell(r.key)],
    ["reason", r.reason],
    ["dead at", `${time(r.dead_at)} (${formatAge(r.dead_age_s)} ago)`],
    ["created at", time(r.created_at)],
    ["available at", time(r.available_at)],
    ["acquired by", cell(r.acquired_by)],
    ["deliveries", String(r.deliveries_count)],
    ["attempts", String(r.attempts_count)],
    ["failures", String(r.failures_count)],
    ["first attempt", time(r.first_attempt_at)],
    ["last attempt", time(r.last_attempt_at)],
    ["headers", JSON.stringify(r.headers)],
  ];
  const indent = (text: string) => text.replace(/^/gm, "  ");
  return [
    ...fields.map(([name, value]) => `${`${name}:`.padEnd(15)}${value}`),
    "error:",
    indent(r.error === null ? "-" : safeText(r.error)),
    "payload:",
    indent(JSON.stringify(r.payload, null, 2)),
  ].join("\n");
}

const REPLAY_OPTIONS = {
  ...CONNECTION_OPTIONS,
  id: { type: "string", multiple: true },
  queue: { type: "string" },
  reason: { type: "string" },
  all: { type: "boolean" },
  "dry-run": { type: "boolean" },
  help: { type: "boolean", short: "h" },
} as const;

function parseReplayArgs(argv: string[]) {
  checkCommandLine(argv, REPLAY_OPTIONS);
  try {
    return parseArgs({ args: argv, options: REPLAY_OPTIONS, allowPositionals: true, strict: true });
  } catch (error) {
    throw new UsageError((error as Error).message);
  }
}

function replayFilter(values: ReturnType<typeof parseReplayArgs>["values"]): ReplayFilter {
  const ids = values.id?.flatMap((v) => v.split(",")).map((v) => parseId(v.trim(), "--id"));
  const { queue, reason } = values;
  const narrowed = ids !== undefined || queue !== undefined || reason !== undefined;
  if (values.all) {
    if (narrowed) throw new UsageError("--all cannot be combined with --id, --queue or --reason");
    return { all: true };
  }
  if (!narrowed) {
    throw new UsageError(
      "refusing to replay without a filter: pass --id, --queue or --reason, or --all to replay every dead letter",
    );
  }
  return { ids, queue, reason };
}

async function replay(argv: string[], io: CliIo): Promise<number> {
  const { values, positionals } = parseReplayArgs(argv);
  if (values.help) return help(io);
  noPositionals(positionals);
  const filter = replayFilter(values);
  const dryRun = values["dry-run"] === true;
  const needs = dryRun ? COMMAND_NEEDS.replayPreview : COMMAND_NEEDS.replay;
  const result = await withCheckedDatabase(values, io.env, "outbox-dead-letters", needs, (client, schema) =>
    replayDeadLetters(client, schema, filter, { dryRun }),
  );
  const moved = byQueue(result.queues.map((q) => ({ queue: q.queue, n: q.replayed })));
  const skippedIds = result.queues.flatMap((q) => q.skippedIds).join(", ");
  const skipped = `${count(result.skipped)} whose id is already in the outbox (left in dead_letters): ${skippedIds}`;
  if (dryRun) {
    print(io, `dry run: would replay ${count(result.replayed)}${moved}; nothing changed`);
    if (result.skipped > 0) print(io, `would skip ${skipped}`);
    return 0;
  }
  print(io, `replayed ${count(result.replayed)}${moved}`);
  if (result.skipped > 0) printError(io, `outbox-worker dead-letters: skipped ${skipped}`);
  if (result.busy > 0) {
    const busyIds = result.queues.flatMap((q) => q.busyIds).join(", ");
    printError(
      io,
      `outbox-worker dead-letters: left ${count(result.busy)} whose keys producers kept locked (still dead letters; replay them again): ${busyIds}`,
    );
  }
  return result.skipped === 0 && result.busy === 0 ? 0 : 1;
}

async function purge(argv: string[], io: CliIo): Promise<number> {
  const { values, positionals } = parseCommandArgs(argv, {
    ...CONNECTION_OPTIONS,
    "older-than": { type: "string" },
    queue: { type: "string" },
    "dry-run": { type: "boolean" },
  });
  if (values.help) return help(io);
  noPositionals(positionals);
  const age = values["older-than"];
  if (typeof age !== "string") throw new UsageError("purge needs --older-than (e.g. 30m, 12h, 7d)");
  const olderThanMs = parseDuration(age);
  const dryRun = values["dry-run"] === true;
  const options = { olderThanMs, queue: values.queue as string | undefined, dryRun };
  const needs = dryRun ? COMMAND_NEEDS.deadLetters : COMMAND_NEEDS.purge;
  const result = await withCheckedDatabase(values, io.env, "outbox-dead-letters", needs, (client, schema) =>
    purgeDeadLetters(client, schema, options),
  );
  const counts = byQueue(result.queues.map((q) => ({ queue: q.queue, n: q.purged })));
  print(
    io,
    dryRun
      ? `dry run: would purge ${count(result.purged)} older than ${age}${counts}; nothing changed`
      : `purged ${count(result.purged)} older than ${age}${counts}`,
  );
  return 0;
}

function help(io: CliIo): number {
  print(io, deadLettersUsage);
  return 0;
}

const subcommands = new Map<string, (argv: string[], io: CliIo) => Promise<number>>([
  ["list", list],
  ["show", show],
  ["replay", replay],
  ["purge", purge],
]);

export async function deadLettersCommand(argv: string[], io: CliIo): Promise<number> {
  const [name, ...rest] = argv;
  if (name === "-h" || name === "--help" || name === "help") return help(io);
  const sub = name === undefined ? undefined : subcommands.get(name);
  if (!sub) throw new UsageError(`expected list, show, replay or purge, got ${JSON.stringify(name ?? "")}`);
  return sub(rest, io);
}
