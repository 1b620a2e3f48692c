import { buildAsyncApi, renderAsyncApi } from "../describe/asyncapi.js";
import { mergeSubscriptions } from "../describe/queues-of-module.js";
import { ConfigError, loadServiceConfig, type ServiceConfig } from "../service/config.js";
import { scrubSecrets } from "../util/redact.js";
import { parseCommandArgs, UsageError } from "./args.js";
import { type CliIo, print, printError } from "./io.js";
import { loadDescribedModule } from "./queues-module.js";

export const asyncapiUsage = `Usage: outbox-worker asyncapi --queues MODULE [--config FILE] [--format yaml|json] [--title TEXT] [--version TEXT]

Prints an AsyncAPI 3.0 document of your queues: one channel per queue, its message payload the JSON
Schema of the queue's zod schema (what is stored and relayed), one "send" operation each. Each topic
is a channel too (address the topic name), with one "send" and one "receive" per queue subscribed to
it in the module or the config (never read from the database).

MODULE (JavaScript or TypeScript) exports queue and topic definitions (defineQueue, defineTopic
results: named exports, or an array or object of them), or is a handlers module (queue name → handler
or handle(queue, fn), an entry's "subscribe" its subscriptions); an export "subscriptions" (queue →
topic names or patterns) declares subscriptions too.

With --config (the service config, read as "run" reads it, OUTBOX_* variables included), each relayed
queue's channel gets the relay's address (HTTP URL path, NATS subject, RabbitMQ routing key, Redis
stream), its server (protocol and host only: never a credential), the headers and CloudEvents
attributes the relay sends, and its bindings. --queues may then be left out when the config names a
handlers module.

Options:
  --queues MODULE      module of queue definitions (or handlers)
  --config FILE        service config whose relays place the channels
  --format yaml|json   output format (default yaml)
  --title TEXT         info.title (default "Outbox events")
  --version TEXT       info.version (default 1.0.0)
  -h, --help           show this help`;

export async function asyncapiCommand(argv: string[], io: CliIo): Promise<number> {
  const { values, positionals } = parseCommandArgs(argv, {
    queues: { type: "string" },
    config: { type: "string" },
    format: { type: "string", default: "yaml" },
    title: { type: "string" },
    version: { type: "string" },
  });
  if (values.help) {
    print(io, asyncapiUsage);
    return 0;
  }
  if (positionals.length > 0) throw new UsageError(`unexpected argument ${JSON.stringify(positionals[0])}`);
  const format = values.format;
  if (format !== "yaml" && format !== "json") {
    throw new UsageError(`--format must be yaml or json, got ${JSON.stringify(format)}`);
  }
  let config: ServiceConfig | undefined;
  if (typeof values.config === "string") {
    try {
      config = await loadServiceConfig({ file: values.config, env: io.env });
    } catch (error) {
      if (error instanceof ConfigError) {
        printError(io, `outbox-worker asyncapi: ${error.message}`);
        return 2;
      }
      throw error;
    }
  }
  const module = (values.queues as string | undefined) ?? config?.handlers;
  if (module === undefined)
    throw new UsageError("--queues MODULE is required (or a --config naming handlers)");
  const described = await loadDescribedModule(module);
  const document = await buildAsyncApi(described.queues, {
    topics: described.topics,
    subscriptions: mergeSubscriptions(described.subscriptions, config?.subscriptions),
    ...(typeof values.title === "string" ? { title: values.title } : {}),
    ...(typeof values.version === "string" ? { version: values.version } : {}),
    ...(config === undefined
      ? {}
      : { relays: config.relays, source: { databaseUrl: config.databaseUrl, schema: config.schema } }),
  });
  // Scrubbed once more, after the relays' secrets were registered: the document holds none, and stays so.
  io.stdout(scrubSecrets(renderAsyncApi(document, format)));
  return 0;
}
