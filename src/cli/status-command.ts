import { queueStatus, workerLeases } from "../inspect/status.js";
import { describeTableHealth, tableHealth } from "../inspect/table-health.js";
import { DEFAULT_SCHEMA } from "../sql/names.js";
import { parseCommandArgs, UsageError, withDatabase } from "./args.js";
import { cell, formatAge, printJson, renderTable } from "./format.js";
import { type CliIo, print } from "./io.js";

export const statusUsage = `Usage: outbox-worker status [--schema NAME] [--database-url URL] [--json]

Per queue: messages ready, blocked (behind an earlier message of their key), scheduled (due later),
leased, with an expired lease, dead letters, the age of the oldest dead letter and of the oldest
ready message; per worker (acquired_by) the rows it holds, expired leases and its oldest lease; then
the messages table's dead tuples, size, last vacuum and whether autovacuum runs for it. Reads only:
no row lock, no lease, never slows or blocks a worker.

Options:
  --schema NAME        outbox schema (default: ${DEFAULT_SCHEMA}, or OUTBOX_SCHEMA)
  --database-url URL   Postgres connection string (default: DATABASE_URL)
  --json               print a JSON array, one object per queue, ages in seconds
  -h, --help           show this help`;

export async function statusCommand(argv: string[], io: CliIo): Promise<number> {
  const { values, positionals } = parseCommandArgs(argv, {
    schema: { type: "string" },
    "database-url": { type: "string" },
    json: { type: "boolean" },
  });
  if (values.help) {
    print(io, statusUsage);
    return 0;
  }
  if (positionals.length > 0) throw new UsageError(`unexpected argument ${JSON.stringify(positionals[0])}`);
  return withDatabase(values, io.env, "outbox-status", async (client, schema) => {
    const rows = await queueStatus(client, schema);
    if (values.json) {
      printJson(io, rows);
      return 0;
    }
    const health = await tableHealth(client, schema);
    if (rows.length === 0) {
      print(io, "no messages");
      if (health) print(io, describeTableHealth(health));
      return 0;
    }
    const right = "right" as const;
    print(
      io,
      renderTable(
        [
          { header: "QUEUE" },
          { header: "READY", align: right },
          { header: "BLOCKED", align: right },
          { header: "SCHEDULED", align: right },
          { header: "LEASED", align: right },
          { header: "EXPIRED", align: right },
          { header: "DEAD", align: right },
          { header: "OLDEST DEAD", align: right },
          { header: "OLDEST READY", align: right },
        ],
        rows.map((r) => [
          cell(r.queue),
          String(r.ready),
          String(r.blocked),
          String(r.scheduled),
          String(r.leased),
          String(r.expired),
          String(r.dead),
          formatAge(r.oldest_dead_age_s),
          formatAge(r.oldest_ready_age_s),
        ]),
      ),
    );
    const workers = await workerLeases(client, schema);
    if (workers.length > 0) {
      print(
        io,
        `\n${renderTable(
          [
            { header: "WORKER" },
            { header: "HELD", align: right },
            { header: "EXPIRED", align: right },
            { header: "OLDEST LEASE", align: right },
          ],
          workers.map((w) => [
            cell(w.worker),
            String(w.held),
            String(w.expired),
            formatAge(w.oldest_lease_age_s),
          ]),
        )}`,
      );
    }
    if (health) print(io, describeTableHealth(health));
    return 0;
  });
}
