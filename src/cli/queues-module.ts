import path from "node:path";
import { OutboxConfigError } from "../contract/errors.js";
import type { QueueDefinition } from "../contract/queue.js";
import { type DescribedModule, describeModule, queuesOfModule } from "../describe/queues-of-module.js";
import { importUserModule } from "../service/user-module.js";

/**
 * The queues of a `--queues` module (JavaScript, or TypeScript through tsx as `run --handlers` loads it);
 * see queuesOfModule for the shapes accepted. A module that cannot be loaded is an error naming the file.
 */
export async function loadQueuesModule(file: string): Promise<QueueDefinition<unknown, unknown>[]> {
  return queuesOfModule(await load(file), file);
}

/** The queues, topics and declared subscriptions of a `--queues` module (see describeModule). */
export async function loadDescribedModule(file: string): Promise<DescribedModule> {
  return describeModule(await load(file), file);
}

async function load(file: string): Promise<Record<string, unknown>> {
  try {
    return await importUserModule(path.resolve(file));
  } catch (error) {
    throw new OutboxConfigError("--queues", `cannot load ${file}: ${(error as Error).message}`);
  }
}
