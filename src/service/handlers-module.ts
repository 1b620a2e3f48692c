import path from "node:path";
import type { Handler, QueueConfig } from "../contract/handler.js";
import { validateQueueName } from "../contract/queue.js";
import { validateTopicPattern } from "../contract/topic.js";
import { ConfigError } from "./config.js";
import { importUserModule } from "./user-module.js";

export type QueueHandlers = Record<string, Handler | QueueConfig>;

/**
 * Load the operator's handlers: a module whose default export (or `queues` export) maps queue names to a
 * handler function or `{ handler, schema?, retry?, maxAttempts?, timeoutMs?, rawPayload?, ordered?, subscribe? }`
 * (what `handle(queue, fn)` returns, or more).
 */
export async function loadHandlersModule(file: string): Promise<QueueHandlers> {
  const full = path.resolve(file);
  let mod: Record<string, unknown>;
  try {
    mod = await importUserModule(full);
  } catch (error) {
    throw new ConfigError([`handlers (OUTBOX_HANDLERS): cannot load ${file}: ${(error as Error).message}`]);
  }
  const exported = (mod.queues ?? mod.default) as unknown;
  if (!exported || typeof exported !== "object") {
    throw new ConfigError([
      `handlers (OUTBOX_HANDLERS): ${file} must export default (or "queues") an object of queue name → handler`,
    ]);
  }
  const problems: string[] = [];
  for (const [queue, entry] of Object.entries(exported)) {
    // Checked here, not first in createWorker: a bad name is a config error (exit 2) before anything
    // connects or an embedded Postgres starts.
    try {
      validateQueueName(queue);
    } catch (error) {
      problems.push(
        `handlers (OUTBOX_HANDLERS): queue name in ${file}: ${(error as Error & { reason: string }).reason}`,
      );
      continue;
    }
    const ok =
      typeof entry === "function" ||
      (entry && typeof entry === "object" && typeof (entry as { handler?: unknown }).handler === "function");
    if (!ok) {
      problems.push(
        `handlers (OUTBOX_HANDLERS): queue "${queue}" in ${file} is not a handler function or { handler }`,
      );
      continue;
    }
    if (typeof entry === "object") problems.push(...subscribeProblems(queue, entry.subscribe, file));
  }
  if (problems.length) throw new ConfigError(problems);
  return exported as QueueHandlers;
}

/** A queue's `subscribe` in the module, checked before anything connects, as the worker would check it. */
function subscribeProblems(queue: string, subscribe: unknown, file: string): string[] {
  if (subscribe === undefined) return [];
  const where = `handlers (OUTBOX_HANDLERS): queue "${queue}" in ${file}`;
  if (!Array.isArray(subscribe)) return [`${where}: subscribe must be an array of topic names or patterns`];
  const problems: string[] = [];
  subscribe.forEach((pattern, i) => {
    try {
      validateTopicPattern(pattern, `subscribe[${i}]`);
    } catch (error) {
      problems.push(`${where}: ${(error as Error).message}`);
    }
  });
  return problems;
}
