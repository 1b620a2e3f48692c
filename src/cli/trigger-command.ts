import pg from "pg";
import {
  disableNotifyTrigger,
  enableNotifyTrigger,
  isNotifyTriggerEnabled,
} from "../migrate/notify-trigger.js";
import { DEFAULT_SCHEMA, validateSchemaName } from "../sql/names.js";
import { databaseUrlFrom, parseCommandArgs, UsageError } from "./args.js";

export const triggerUsage = `Usage: outbox-worker trigger enable|disable|status [--schema NAME] [--database-url URL]

The optional wake-up trigger, for producers that INSERT into the outbox with plain SQL. Rows inserted
without it are still delivered, at the worker's next poll. It makes every inserting transaction
NOTIFY, which serialises their commits: see the README for the measured cost.`;

export async function triggerCommand(argv: string[]): Promise<number> {
  const { values, positionals } = parseCommandArgs(argv, {
    schema: { type: "string" },
    "database-url": { type: "string" },
  });
  if (values.help) {
    console.log(triggerUsage);
    return 0;
  }
  const action = positionals[0];
  if (action !== "enable" && action !== "disable" && action !== "status") {
    throw new UsageError(`expected enable, disable or status, got ${JSON.stringify(action ?? "")}`);
  }
  const schema = validateSchemaName(
    (values.schema as string | undefined) ?? process.env.OUTBOX_SCHEMA ?? DEFAULT_SCHEMA,
  );
  const url = databaseUrlFrom(values["database-url"]);
  if (!url) throw new UsageError("no database: set DATABASE_URL or pass --database-url");
  const client = new pg.Client({ connectionString: url, application_name: "outbox-trigger" });
  await client.connect();
  try {
    if (action === "status") {
      console.log(
        `wake-up trigger on "${schema}".messages: ${(await isNotifyTriggerEnabled(client, schema)) ? "enabled" : "disabled"}`,
      );
      return 0;
    }
    await client.query("BEGIN");
    if (action === "enable") await enableNotifyTrigger(client, schema);
    else await disableNotifyTrigger(client, schema);
    await client.query("COMMIT");
    console.log(`wake-up trigger on "${schema}".messages ${action}d`);
    return 0;
  } finally {
    await client.end();
  }
}
