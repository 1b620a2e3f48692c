/**
 * Regenerates what the consumer examples are typed with, the way a consuming team would: the queues'
 * JSON Schemas (examples/consumers/schemas/, as `outbox-worker schemas` writes them) and TypeScript types
 * generated from those files by json-schema-to-typescript (examples/consumers/types/).
 *   npx tsx scripts/consumer-types.ts           write them
 *   npx tsx scripts/consumer-types.ts --check   exit 1 when a file is missing or stale
 * test/project/consumer-examples.test.ts runs the check, so a queue schema change cannot leave the types behind.
 */
import { execFileSync } from "node:child_process";
import { mkdir, readFile, writeFile } from "node:fs/promises";
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { compile } from "json-schema-to-typescript";
import { loadQueuesModule } from "../src/cli/queues-module.js";
import { queueSchemaDocument, schemaFileNames } from "../src/describe/json-schema.js";

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const CONSUMERS = "examples/consumers";

/** Formatted as `biome check --write` would leave it, so the check does not trip over layout. */
function biomeFormat(relative: string, text: string): string {
  return execFileSync(
    path.join(ROOT, "node_modules/.bin/biome"),
    ["format", `--stdin-file-path=${relative}`],
    {
      cwd: ROOT,
      input: text,
      encoding: "utf8",
    },
  );
}

/** Every generated file, path relative to the repository → content. */
export async function consumerFiles(): Promise<Map<string, string>> {
  const queues = await loadQueuesModule(path.join(ROOT, CONSUMERS, "queues.ts"));
  const names = schemaFileNames(queues.map((q) => q.name));
  const files = new Map<string, string>();
  for (const queue of queues) {
    const schemaFile = names.get(queue.name) ?? "";
    const document = queueSchemaDocument(queue);
    const schemaPath = `${CONSUMERS}/schemas/${schemaFile}`;
    files.set(schemaPath, biomeFormat(schemaPath, JSON.stringify(document)));
    const typesPath = `${CONSUMERS}/types/${schemaFile.replace(/\.schema\.json$/, ".ts")}`;
    const source = await compile(document as Parameters<typeof compile>[0], queue.name, {
      bannerComment: `/* Generated from ${schemaPath} by scripts/consumer-types.ts (json-schema-to-typescript): do not edit. */`,
      format: false,
    });
    files.set(typesPath, biomeFormat(typesPath, source));
  }
  return files;
}

async function main(): Promise<void> {
  const check = process.argv.includes("--check");
  const stale: string[] = [];
  for (const [relative, content] of await consumerFiles()) {
    const file = path.join(ROOT, relative);
    if (check) {
      const current = await readFile(file, "utf8").catch(() => undefined);
      if (current !== content) stale.push(relative);
    } else {
      await mkdir(path.dirname(file), { recursive: true });
      await writeFile(file, content);
      console.log(`wrote ${relative}`);
    }
  }
  if (stale.length > 0) {
    console.error(`stale, run npx tsx scripts/consumer-types.ts: ${stale.join(", ")}`);
    process.exitCode = 1;
  }
}

// Run as a script, not when the test imports consumerFiles.
if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(path.resolve(process.argv[1])).href) {
  await main();
}
