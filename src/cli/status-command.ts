import { queueStatus, workerLeases } from "../inspect/status.js";
import { NO_SUBSCRIBERS, type TopicStatus, topicStatus } from "../inspect/subscriptions-status.js";
import { describeTableHealth, tableHealth } from "../inspect/table-health.js";
import { DEFAULT_SCHEMA } from "../sql/names.js";
import { parseCommandArgs, UsageError } from "./args.js";
import { COMMAND_NEEDS, withCheckedDatabase } from "./checked-database.js";
import { cell, formatAge, printJson, renderTable } from "./format.js";
import { type CliIo, print } from "./io.js";

export const statusUsage = `Usage: outbox-worker status [--schema NAME] [--database-url URL] [--json]

Per queue: messages ready, blocked (behind an earlier message of their key), scheduled (due later),
leased, with an expired lease, dead letters, the age of the oldest dead letter and of the oldest
ready message; per worker (acquired_by) the rows it holds, expired leases and its oldest lease; each
topic pattern and the queues subscribed to it, and per topic the events kept because no queue
subscribed to it (dead letters ${NO_SUBSCRIBERS}); then the messages table's dead tuples, size, last
vacuum and whether autovacuum runs for it. Reads only: no row lock, no lease, never slows or blocks a
worker.

Options:
  --schema NAME        outbox schema (default: ${DEFAULT_SCHEMA}, or OUTBOX_SCHEMA)
  --database-url URL   Postgres connection string (default: DATABASE_URL)
  --json               print one JSON object: queues, workers, subscriptions, unrouted, table;
                       ages in seconds
  -h, --help           show this help`;

const right = "right" as const;

/** The topic side, as text; nothing at all for an outbox that uses no topics. */
function describeTopics(topics: TopicStatus, schema: string): string[] {
  const out: string[] = [];
  const { subscriptions, unrouted } = topics;
  if (subscriptions === null) {
    out.push(`subscriptions: not shown (this role may not read ${schema}.subscriptions)`);
  } else if (subscriptions.length > 0) {
    out.push(
      renderTable(
        [{ header: "TOPIC" }, { header: "SUBSCRIBED QUEUES" }],
        subscriptions.map((s) => [cell(s.pattern), s.queues.map((q) => cell(q)).join(", ")]),
      ),
    );
  }
  if (unrouted.events > 0) {
    const more = unrouted.topics - unrouted.byTopic.length;
    const plural = unrouted.events === 1 ? "event" : "events";
    out.push(
      [
        renderTable(
          [
            { header: "UNROUTED TOPIC" },
            { header: "EVENTS", align: right },
            { header: "OLDEST", align: right },
          ],
          unrouted.byTopic.map((t) => [cell(t.topic), String(t.events), formatAge(t.oldest_age_s)]),
        ),
        ...(more > 0 ? [`… and ${more} more topic${more === 1 ? "" : "s"}`] : []),
        `${unrouted.events} ${plural} kept as dead letters ${NO_SUBSCRIBERS}: no queue subscribed to their topic. ` +
          `Subscribe one, then: outbox-worker dead-letters replay --reason ${NO_SUBSCRIBERS}`,
      ].join("\n"),
    );
  }
  return out;
}

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
  const needs = COMMAND_NEEDS.status;
  return withCheckedDatabase(values, io.env, "outbox-status", needs, async (client, schema) => {
    // One client, so one statement at a time: in order, and each its own snapshot.
    const rows = await queueStatus(client, schema);
    const workers = await workerLeases(client, schema);
    const topics = await topicStatus(client, schema);
    const health = await tableHealth(client, schema);
    if (values.json) {
      printJson(io, { queues: rows, workers, ...topics, table: health ?? null });
      return 0;
    }
    const sections: string[] = [];
    if (rows.length === 0) {
      sections.push("no messages");
    } else {
      sections.push(
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
    }
    if (workers.length > 0) {
      sections.push(
        renderTable(
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
        ),
      );
    }
    sections.push(...describeTopics(topics, schema));
    print(io, sections.join("\n\n"));
    if (health) print(io, describeTableHealth(health));
    return 0;
  });
}
