import pg from "pg";
import { DATABASE_URL } from "../lib.js";

/** What every system under test offers the bench jobs. One instance = one fresh schema. */
export interface Peer {
  readonly name: string;
  /** Create the peer's schema from scratch (dropping a leftover one). */
  setup(): Promise<void>;
  /**
   * Insert `rows` ready jobs with ~100-byte payloads up front, then VACUUM ANALYZE. With `keys`, job n
   * (1-based) carries the ordering key `k<n % keys>` (interleaved in id order, like real traffic), in the
   * peer's per-key FIFO (this project's key, graphile-worker's named queue, pg-boss's singletonKey).
   */
  fill(rows: number, keys?: number): Promise<void>;
  /** Start one worker in this process; `onJob` is called as each handler starts, with its payload. */
  startWorker(options: WorkerOptions): Promise<void>;
  stopWorker(): Promise<void>;
  /** Jobs not yet completed in the database. */
  remaining(): Promise<number>;
  /** The channel its wake-ups are sent on (a bench LISTENs there, as a worker would). */
  channel(): Promise<string>;
  /** A producer with `clients` connections; `mode` picks a variant (peer-specific, "default" always exists). */
  producer(clients: number, mode: string): Promise<Producer>;
  /** Drop the schema. */
  teardown(): Promise<void>;
}

export interface WorkerOptions {
  concurrency: number;
  /** Wake-ups by LISTEN/NOTIFY; false: poll only. */
  listen: boolean;
  onJob(payload: { orderId: number }): void;
  /** Peer-specific knobs (pg-boss batch size and local concurrency). */
  tuning?: Record<string, number>;
}

export interface Producer {
  /** One message `payload(n)` in its own transaction; resolves once committed. */
  publish(n: number): Promise<void>;
  /** `count` messages `payload(from…)` in one statement, in its own transaction. */
  publishBatch(from: number, count: number): Promise<void>;
  close(): Promise<void>;
}

export const QUEUE = "bench";

/** The ordering key of job n among `keys` keys (see Peer.fill). */
export const keyOf = (n: number, keys: number): string => `k${n % keys}`;

/** A small admin pool for setup, fills and polls (never used by the worker under test). */
export function adminPool(): pg.Pool {
  return new pg.Pool({ connectionString: DATABASE_URL, max: 2, application_name: "bench-admin" });
}

export async function dropSchema(pool: pg.Pool, schema: string): Promise<void> {
  await pool.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
}

/** VACUUM ANALYZE every table of a schema, then CHECKPOINT, so each measured run starts alike. */
export async function vacuumSchema(pool: pg.Pool, schema: string): Promise<void> {
  const { rows } = await pool.query<{ t: string }>(
    "SELECT format('%I.%I', schemaname, tablename) AS t FROM pg_tables WHERE schemaname = $1",
    [schema],
  );
  for (const { t } of rows) await pool.query(`VACUUM ANALYZE ${t}`);
  await pool.query("CHECKPOINT");
}
