import { mkdir, writeFile } from "node:fs/promises";
import path from "node:path";
import { queueSchemaDocument, schemaFileNames, topicSchemaDocument } from "../describe/json-schema.js";
import { parseCommandArgs, UsageError } from "./args.js";
import { type CliIo, print } from "./io.js";
import { loadDescribedModule } from "./queues-module.js";

export const schemasUsage = `Usage: outbox-worker schemas --queues MODULE --out DIR

Writes one JSON Schema (draft 2020-12) per queue to DIR, <queue>.schema.json ("/" and ":" in a queue
name written as %2F and %3A): the payload each relay sends, for consumers in other languages (code
generators such as quicktype, json-schema-to-typescript, datamodel-code-generator). Same schemas as
the "asyncapi" command's payloads. Each topic gets <topic>.topic.json, and a queue made with
subscriberQueue(topic, name) refers to it ($ref) instead of repeating it. Existing files of the same
names are replaced; others are left.

MODULE (JavaScript or TypeScript) exports queue and topic definitions (defineQueue, defineTopic
results: named exports, or an array or object of them), or is a handlers module (queue name → handler
or handle(queue, fn)).

Options:
  --queues MODULE   module of queue definitions (or handlers)
  --out DIR         folder to write to (created when missing)
  -h, --help        show this help`;

export async function schemasCommand(argv: string[], io: CliIo): Promise<number> {
  const { values, positionals } = parseCommandArgs(argv, {
    queues: { type: "string" },
    out: { type: "string" },
  });
  if (values.help) {
    print(io, schemasUsage);
    return 0;
  }
  if (positionals.length > 0) throw new UsageError(`unexpected argument ${JSON.stringify(positionals[0])}`);
  if (typeof values.queues !== "string") throw new UsageError("--queues MODULE is required");
  if (typeof values.out !== "string") throw new UsageError("--out DIR is required");
  const { queues, topics } = await loadDescribedModule(values.queues);
  const queueFiles = schemaFileNames(queues.map((q) => q.name));
  const topicFiles = schemaFileNames(
    topics.map((t) => t.topic),
    "topics",
  );
  // Every schema first: one that cannot be written fails the command before any file is.
  const documents = [
    ...queues.map((q) => ({
      label: q.name,
      file: queueFiles.get(q.name),
      document: queueSchemaDocument(q, topics),
    })),
    ...topics.map((t) => ({
      label: `topic ${t.topic}`,
      file: topicFiles.get(t.topic),
      document: topicSchemaDocument(t),
    })),
  ];
  await mkdir(values.out, { recursive: true });
  for (const { label, file: name, document } of documents) {
    const file = path.join(values.out, name ?? "");
    await writeFile(file, `${JSON.stringify(document, null, 2)}\n`);
    print(io, `${label} → ${file}`);
  }
  return 0;
}
