import {
  disableNotifyTrigger,
  enableNotifyTrigger,
  isNotifyTriggerEnabled,
} from "../migrate/notify-trigger.js";
import { BEGIN, COMMIT } from "../sql/transaction.js";
import { parseCommandArgs, UsageError, withDatabase } from "./args.js";
import { type CliIo, print } from "./io.js";

export const triggerUsage = `Usage: outbox-worker trigger enable|disable|status [--schema NAME] [--database-url URL]

The optional wake-up trigger, for producers that INSERT into the outbox with plain SQL. Rows inserted
without it are still delivered, at the worker's next poll. It makes every inserting transaction
NOTIFY, which serialises their commits: see docs/guide/publishing.md for the measured cost.`;

export async function triggerCommand(argv: string[], io: CliIo): Promise<number> {
  const { values, positionals } = parseCommandArgs(argv, {
    schema: { type: "string" },
    "database-url": { type: "string" },
  });
  if (values.help) {
    print(io, triggerUsage);
    return 0;
  }
  const action = positionals[0];
  if (action !== "enable" && action !== "disable" && action !== "status") {
    throw new UsageError(`expected enable, disable or status, got ${JSON.stringify(action ?? "")}`);
  }
  return withDatabase(values, io.env, "outbox-trigger", async (client, schema) => {
    if (action === "status") {
      print(
        io,
        `wake-up trigger on "${schema}".messages: ${(await isNotifyTriggerEnabled(client, schema)) ? "enabled" : "disabled"}`,
      );
      return 0;
    }
    await client.query(BEGIN.text);
    if (action === "enable") await enableNotifyTrigger(client, schema);
    else await disableNotifyTrigger(client, schema);
    await client.query(COMMIT.text);
    print(io, `wake-up trigger on "${schema}".messages ${action}d`);
    return 0;
  });
}
