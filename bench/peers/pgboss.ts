/**
 * pg-boss 12 with batch fetch: `work(queue, { batchSize, localConcurrency, burstWhenBatchFull: true })`
 * (without burstWhenBatchFull a worker waits out its polling interval even after a full batch). Wake-ups:
 * `useListenNotify: true` and a queue created with `notify: true`; poll-only: neither, polling every
 * 0.5 s (its minimum). Pool: max(10, localConcurrency + 2).
 *
 * Loaded from bench/node_modules at run time (the root typecheck does not see bench's dependencies).
 */
import { DATABASE_URL, payload } from "../lib.js";
import { adminPool, dropSchema, keyOf, type Peer, type Producer, QUEUE, vacuumSchema } from "./peer.js";

interface Boss {
  on(event: string, fn: (e: unknown) => void): void;
  start(): Promise<unknown>;
  stop(options?: { graceful?: boolean; timeout?: number; close?: boolean }): Promise<void>;
  createQueue(name: string, options?: Record<string, unknown>): Promise<void>;
  send(name: string, data: object): Promise<string | null>;
  insert(name: string, jobs: { data: object; singletonKey?: string }[]): Promise<unknown>;
  work(
    name: string,
    options: Record<string, unknown>,
    handler: (jobs: { data: { orderId: number } }[]) => Promise<void>,
  ): Promise<string>;
}
type BossClass = new (options: Record<string, unknown>) => Boss;

const MODULE = "pg-boss";
const load = async () => ((await import(MODULE)) as { PgBoss: BossClass }).PgBoss;

export const PGBOSS_POLL_SECONDS = 0.5;

/** pg-boss's batch knobs for a given handler concurrency (see RESULTS.md for how they were chosen). */
export function pgbossTuning(concurrency: number): { batchSize: number; localConcurrency: number } {
  return { batchSize: 500, localConcurrency: Math.min(concurrency, 4) };
}

/**
 * `keyed`: the queue is created with `policy: 'key_strict_fifo'` (pg-boss 12's per-key FIFO: a job runs only
 * after every earlier job of its `singletonKey` completed), and fills put each job's key in `singletonKey`.
 */
export function pgbossPeer(schema: string, notify: boolean, keyed = false): Peer {
  const admin = adminPool();
  const bosses: Boss[] = [];

  async function boss(max: number, listen: boolean): Promise<Boss> {
    const PgBoss = await load();
    const b = new PgBoss({
      connectionString: DATABASE_URL,
      schema,
      max,
      useListenNotify: listen,
      schedule: false,
    });
    b.on("error", (e) => console.error("pg-boss error:", e));
    await b.start();
    bosses.push(b);
    return b;
  }

  async function stop(b: Boss): Promise<void> {
    bosses.splice(bosses.indexOf(b), 1);
    await b.stop({ graceful: true, timeout: 5000 });
  }

  return {
    name: "pg-boss",
    async setup() {
      await dropSchema(admin, schema);
      const b = await boss(2, false);
      await b.createQueue(QUEUE, { notify, ...(keyed ? { policy: "key_strict_fifo" } : {}) });
      await stop(b);
    },
    async fill(rows, keys) {
      const b = await boss(2, false);
      // key_strict_fifo orders a key by created_on, then by the (random uuid) id: jobs of one insert share
      // created_on, so each insert holds at most one job per key, and a key's jobs go in in order.
      const chunk = Math.min(5000, keys ?? 5000);
      for (let from = 1; from <= rows; from += chunk) {
        const count = Math.min(chunk, rows - from + 1);
        await b.insert(
          QUEUE,
          Array.from({ length: count }, (_, i) => ({
            data: payload(from + i),
            ...(keys ? { singletonKey: keyOf(from + i, keys) } : {}),
          })),
        );
      }
      await stop(b);
      await vacuumSchema(admin, schema);
    },
    async startWorker({ concurrency, listen, onJob, tuning }) {
      const { batchSize, localConcurrency } = { ...pgbossTuning(concurrency), ...tuning };
      const b = await boss(Math.max(10, localConcurrency + 2), listen && notify);
      await b.work(
        QUEUE,
        {
          batchSize,
          localConcurrency,
          burstWhenBatchFull: true,
          pollingIntervalSeconds: PGBOSS_POLL_SECONDS,
        },
        async (jobs) => {
          for (const job of jobs) onJob(job.data);
        },
      );
    },
    async stopWorker() {
      await Promise.all(bosses.splice(0).map((b) => b.stop({ graceful: true, timeout: 10_000 })));
    },
    async remaining() {
      return (
        await admin.query(
          `SELECT count(*)::int AS n FROM "${schema}".job WHERE name = $1 AND state < 'completed'`,
          [QUEUE],
        )
      ).rows[0].n;
    },
    async channel() {
      const { rows } = await admin.query(
        "SELECT 'pgboss_' || left(encode(sha224($1::bytea), 'hex'), 24) AS c",
        [schema],
      );
      return rows[0].c;
    },
    async producer(clients) {
      const b = await boss(clients, false);
      const producer: Producer = {
        publish: async (n) => {
          await b.send(QUEUE, payload(n));
        },
        publishBatch: async (from, count) => {
          await b.insert(
            QUEUE,
            Array.from({ length: count }, (_, i) => ({ data: payload(from + i) })),
          );
        },
        close: async () => {},
      };
      return producer;
    },
    async teardown() {
      await Promise.all(bosses.splice(0).map((b) => b.stop({ graceful: false, timeout: 1000 })));
      await dropSchema(admin, schema);
      await admin.end();
    },
  };
}
