import type pg from "pg";
import type { ListenerState } from "../notify/notifier.js";
import { runQuery } from "../sql/executor.js";
import { backendPidStatement } from "../sql/probes.js";

/**
 * Whether a connection pooler answers for Postgres on this pool: the process id a connection announced
 * when it opened (BackendKeyData) is not the server process that runs its statements. PgBouncer, in any
 * pool mode, and the other poolers hand out their own cancel keys; Postgres, or a TCP proxy in front of
 * it, announces the real one. Undefined when the probe could not tell (the database not answering yet,
 * a driver that keeps no process id).
 */
export async function poolerInBetween(pool: pg.Pool, timeoutMs: number): Promise<boolean | undefined> {
  // A pool of the caller's may have no connect timeout: start() must not wait on a black-holed host.
  let timer: NodeJS.Timeout | undefined;
  const gaveUp = new Promise<undefined>((resolve) => {
    timer = setTimeout(resolve, timeoutMs, undefined);
  });
  try {
    return await Promise.race([probe(pool, timeoutMs), gaveUp]);
  } finally {
    clearTimeout(timer);
  }
}

async function probe(pool: pg.Pool, timeoutMs: number): Promise<boolean | undefined> {
  let client: pg.PoolClient | undefined;
  try {
    client = await pool.connect();
    const announced = (client as unknown as { processID?: unknown }).processID;
    const [row] = await runQuery(client, backendPidStatement, {}, { timeoutMs });
    client.release();
    if (typeof announced !== "number" || row === undefined) return undefined;
    return row.pid !== announced;
  } catch (error) {
    // Never back into the pool mid-answer. The first fetch meets the same trouble and reports it.
    client?.release(error instanceof Error ? error : new Error(String(error)));
    return undefined;
  }
}

/**
 * Why the worker's statements must be unnamed from the start, or undefined when named ones are safe.
 * A transaction-mode pooler loses them between statements; a session-mode one keeps them. The pool
 * probe says whether a pooler is there, and LISTEN through the same address says which mode: its
 * self-test gets its notification in session mode and never in transaction mode.
 */
export function unnamedStatementsReason(seen: {
  pooler: boolean | undefined;
  /** The listener's state after its first self-test; undefined when it is off or listens elsewhere. */
  listenerOnPoolAddress: ListenerState | undefined;
}): string | undefined {
  const { pooler, listenerOnPoolAddress: listener } = seen;
  // Nothing in between: a failed self-test has another cause (a slow server), not a pooler.
  if (pooler === false) return undefined;
  if (listener === "poll_only") {
    return "LISTEN through the same address gets no notifications: a transaction-mode pooler";
  }
  if (pooler === true && listener !== "listening") {
    return "a connection pooler answers for the server (its process id is not the one the connection announced), and nothing shows it keeps a session per connection";
  }
  return undefined;
}
