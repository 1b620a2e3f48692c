import { MAX_LIMIT, MESSAGE_STATES, type MessageState, peekMessages } from "../inspect/peek.js";
import { DEFAULT_SCHEMA } from "../sql/names.js";
import { parseCommandArgs, UsageError } from "./args.js";
import { COMMAND_NEEDS, withCheckedDatabase } from "./checked-database.js";
import { cell, formatAge, jsonCell, printJson, renderTable } from "./format.js";
import { type CliIo, print } from "./io.js";

export const peekUsage = `Usage: outbox-worker peek [--queue Q] [--state STATE] [--limit N] [--json]
                         [--schema NAME] [--database-url URL]

Messages still to deliver, oldest first, from the lease-free unprocessed view. Takes no lease and no
row lock, changes nothing, and never waits for a worker. The table cuts long payloads and errors;
--json prints them whole.

Options:
  --queue Q            only this queue
  --state STATE        only ${MESSAGE_STATES.join(", ")}
  --limit N            at most N messages, 1 to ${MAX_LIMIT} (default 20)
  --json               print a JSON array (ages in seconds)
  --schema NAME        outbox schema (default: ${DEFAULT_SCHEMA}, or OUTBOX_SCHEMA)
  --database-url URL   Postgres connection string (default: DATABASE_URL)
  -h, --help           show this help`;

/** --limit: a plain whole number from 1 to 1000. */
export function parseLimit(raw: string | boolean | undefined): number | undefined {
  if (raw === undefined) return undefined;
  const text = String(raw);
  const n = /^[0-9]{1,4}$/.test(text) ? Number(text) : Number.NaN;
  if (!(n >= 1 && n <= MAX_LIMIT)) {
    throw new UsageError(
      `--limit must be a whole number from 1 to ${MAX_LIMIT}, got ${JSON.stringify(text)}`,
    );
  }
  return n;
}

function parseState(raw: string | boolean | undefined): MessageState | undefined {
  if (raw === undefined) return undefined;
  const state = MESSAGE_STATES.find((s) => s === raw);
  if (!state) {
    throw new UsageError(`--state must be one of ${MESSAGE_STATES.join(", ")}, got ${JSON.stringify(raw)}`);
  }
  return state;
}

export async function peekCommand(argv: string[], io: CliIo): Promise<number> {
  const { values, positionals } = parseCommandArgs(argv, {
    queue: { type: "string" },
    state: { type: "string" },
    limit: { type: "string" },
    json: { type: "boolean" },
    schema: { type: "string" },
    "database-url": { type: "string" },
  });
  if (values.help) {
    print(io, peekUsage);
    return 0;
  }
  if (positionals.length > 0) throw new UsageError(`unexpected argument ${JSON.stringify(positionals[0])}`);
  const options = {
    queue: values.queue as string | undefined,
    state: parseState(values.state),
    limit: parseLimit(values.limit),
  };
  return withCheckedDatabase(values, io.env, "outbox-peek", COMMAND_NEEDS.peek, async (client, schema) => {
    const rows = await peekMessages(client, schema, options);
    if (values.json) {
      printJson(io, rows);
      return 0;
    }
    if (rows.length === 0) {
      print(io, "no messages");
      return 0;
    }
    print(
      io,
      renderTable(
        [
          { header: "ID", align: "right" },
          { header: "QUEUE" },
          { header: "KEY" },
          { header: "STATE" },
          { header: "AGE", align: "right" },
          { header: "DELIVERIES", align: "right" },
          { header: "ATTEMPTS", align: "right" },
          { header: "LAST ERROR" },
          { header: "PAYLOAD" },
        ],
        rows.map((r) => [
          r.id,
          cell(r.queue),
          cell(r.key, 24),
          r.state,
          formatAge(r.age_s),
          String(r.deliveries_count),
          String(r.attempts_count),
          cell(r.last_error, 40),
          jsonCell(r.payload, 60),
        ]),
      ),
    );
    return 0;
  });
}
