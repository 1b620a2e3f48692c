import path from "node:path";
import { OutboxConfigError } from "../contract/errors.js";
import type { QueueDefinition } from "../contract/queue.js";
import { queuesOfModule } from "../describe/queues-of-module.js";
import { importUserModule } from "../service/user-module.js";

/**
 * The queues of a `--queues` module (JavaScript, or TypeScript through tsx as `run --handlers` loads it);
 * see queuesOfModule for the shapes accepted. A module that cannot be loaded is an error naming the file.
 */
export async function loadQueuesModule(file: string): Promise<QueueDefinition<unknown, unknown>[]> {
  let mod: Record<string, unknown>;
  try {
    mod = await importUserModule(path.resolve(file));
  } catch (error) {
    throw new OutboxConfigError("--queues", `cannot load ${file}: ${(error as Error).message}`);
  }
  return queuesOfModule(mod, file);
}
