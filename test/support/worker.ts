import { afterEach } from "vitest";
import { createPublisher } from "../../src/produce/publisher.js";
import type { WorkerOptions } from "../../src/worker/options.js";
import { createWorker, type Worker } from "../../src/worker/worker.js";

/** Wait until `check` holds, re-checking every few ms; fails with `what` after the timeout. */
export async function until(check: () => boolean | Promise<boolean>, what: string, timeoutMs = 30_000) {
  const deadline = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for: ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
}

/** Resolves with the first event of that name satisfying `match`, or rejects after the timeout. */
export function nextEvent<E>(
  worker: Worker,
  event: Parameters<Worker["on"]>[0],
  match: (e: E) => boolean = () => true,
  timeoutMs = 30_000,
): Promise<E> {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      off();
      reject(new Error(`no "${event}" event within ${timeoutMs} ms`));
    }, timeoutMs);
    const off = worker.on(event, ((e: E) => {
      if (!match(e)) return;
      clearTimeout(timer);
      off();
      resolve(e);
    }) as never);
  });
}

/** Workers made through this are stopped after each test, even when it fails. */
export function workerFactory(defaults: { url: string; schema: string }) {
  const started: Worker[] = [];
  afterEach(async () => {
    await Promise.all(started.splice(0).map((w) => w.stop({ timeoutMs: 2000 }).catch(() => {})));
  });
  return {
    async start(options: Partial<WorkerOptions> & Pick<WorkerOptions, "queues">): Promise<Worker> {
      const worker = createWorker({
        connection: defaults.url,
        schema: defaults.schema,
        logger: false,
        minPollIntervalMs: 20,
        maxPollIntervalMs: 200,
        ...options,
      });
      started.push(worker);
      await worker.start();
      return worker;
    },
  };
}

export function publisherFor(schema: string) {
  return createPublisher({ schema, notify: { cooldownMs: 0 } });
}

/**
 * Terminates the transaction-held batches of the worker `workerId` (its sessions idle in a transaction that
 * holds an xid), never another test file's sessions in the same database.
 */
export async function killBatchesOf(
  pool: { query(text: string, values: unknown[]): Promise<unknown> },
  workerId: string,
): Promise<void> {
  await pool.query(
    `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
     WHERE datname = current_database() AND application_name = $1
       AND state = 'idle in transaction' AND backend_xid IS NOT NULL`,
    [`outbox-worker ${workerId}`],
  );
}
