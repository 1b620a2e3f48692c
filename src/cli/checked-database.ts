import type pg from "pg";
import { OutboxConfigError } from "../contract/errors.js";
import { checkSchema, connectionFailure } from "../service/startup.js";
import { type GrantOption, READ_RIGHTS, type Right, rightsOf, VERSION_RIGHTS } from "../sql/grants.js";
import { UsageError, withDatabase } from "./args.js";

/** The rights an inspection command needs, by the grant option that gives them. */
export type CommandNeeds = readonly { option: GrantOption; rights: readonly Right[] }[];

const read = (rights: readonly Right[]): CommandNeeds => [
  { option: "--inspector", rights: [...VERSION_RIGHTS, ...rights] },
];

/** What each inspection command needs (a worker's role holds the reads too, but a person's is the inspector's). */
export const COMMAND_NEEDS = {
  status: read(READ_RIGHTS.status),
  peek: read(READ_RIGHTS.peek),
  deadLetters: read(READ_RIGHTS.deadLetters),
  replayPreview: read(READ_RIGHTS.replayPreview),
  replay: [
    ...read(READ_RIGHTS.replayPreview),
    { option: "--inspector-can-repair", rights: rightsOf("--inspector-can-repair") },
  ],
  purge: [
    ...read(READ_RIGHTS.deadLetters),
    {
      option: "--inspector-can-repair",
      rights: [{ kind: "table", object: "dead_letters", privilege: "DELETE" }],
    },
  ],
} as const satisfies Record<string, CommandNeeds>;

/**
 * `withDatabase`, with the checks `run` makes first (the same code): a connection refused says what to
 * check, a schema not migrated or older says to migrate, a missing right names the grant option that gives
 * it, before the command reads anything.
 */
export async function withCheckedDatabase<T>(
  values: Parameters<typeof withDatabase>[0],
  env: NodeJS.ProcessEnv,
  applicationName: string,
  needs: CommandNeeds,
  run: (client: pg.Client, schema: string) => Promise<T>,
): Promise<T> {
  let connected = false;
  try {
    return await withDatabase(values, env, applicationName, async (client, schema) => {
      connected = true;
      await checkSchema({
        pool: client,
        schema,
        need: [],
        needRights: needs.flatMap((n) => n.rights.map((right) => ({ option: n.option, right }))),
        migrateHint: "as the schema's owner",
      });
      return run(client, schema);
    });
  } catch (error) {
    // Before the connection: a command line or config mistake, said as it is. The connection itself
    // failing: said as `run` says it.
    if (connected || error instanceof UsageError || error instanceof OutboxConfigError) throw error;
    throw connectionFailure(error);
  }
}
