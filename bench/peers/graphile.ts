/**
 * graphile-worker 0.18, at the settings its performance page documents as its best: a local queue of
 * 500 jobs, batched completion and failure (`completeJobBatchDelay: 0`, `failJobBatchDelay: 0`), and a
 * pool of max(10, concurrency + 2) as its docs recommend.
 *
 * Loaded from bench/node_modules at run time (the root typecheck does not see bench's dependencies).
 * graphile-worker has no switch to stop listening: poll-only undoes its LISTEN on the listen connection
 * (`pool:listen:success` event, then `UNLISTEN "jobs:insert"`) and polls every `pollInterval` ms (100 here,
 * like this project's minimum).
 */
import { EventEmitter } from "node:events";
import pg from "pg";
import { DATABASE_URL, payload } from "../lib.js";
import { adminPool, dropSchema, keyOf, type Peer, type Producer, QUEUE, vacuumSchema } from "./peer.js";

interface Runner {
  stop(): Promise<void>;
}
interface Utils {
  migrate(): Promise<void>;
  addJob(identifier: string, payload: unknown): Promise<unknown>;
  addJobs(specs: { identifier: string; payload: unknown; queueName?: string }[]): Promise<unknown>;
  release(): Promise<void>;
}
interface GraphileModule {
  run(options: Record<string, unknown>): Promise<Runner>;
  makeWorkerUtils(options: Record<string, unknown>): Promise<Utils>;
  Logger: new (factory: () => () => void) => unknown;
}

const MODULE = "graphile-worker";
const load = async () => (await import(MODULE)) as GraphileModule;

export const GRAPHILE_LOCAL_QUEUE = 500;
export const GRAPHILE_POLL_ONLY_INTERVAL_MS = 100;

export function graphilePeer(schema: string): Peer {
  const admin = adminPool();
  let runner: Runner | undefined;

  async function utils(pool?: pg.Pool): Promise<Utils> {
    const gw = await load();
    return gw.makeWorkerUtils({
      schema,
      logger: new gw.Logger(() => () => {}),
      ...(pool ? { pgPool: pool } : { connectionString: DATABASE_URL }),
    });
  }

  return {
    name: "graphile-worker",
    async setup() {
      await dropSchema(admin, schema);
      const u = await utils();
      await u.migrate();
      await u.release();
    },
    async fill(rows, keys) {
      const u = await utils();
      for (let from = 1; from <= rows; from += 5000) {
        const count = Math.min(5000, rows - from + 1);
        await u.addJobs(
          Array.from({ length: count }, (_, i) => ({
            identifier: QUEUE,
            payload: payload(from + i),
            // A named queue per key: graphile-worker runs a named queue's jobs one at a time, in order.
            ...(keys ? { queueName: keyOf(from + i, keys) } : {}),
          })),
        );
      }
      await u.release();
      await vacuumSchema(admin, schema);
    },
    async startWorker({ concurrency, listen, onJob }) {
      const gw = await load();
      const events = new EventEmitter();
      if (!listen) {
        // Emitted just before graphile queues its LISTEN on that client: queue the UNLISTEN after it.
        events.on("pool:listen:success", ({ client }: { client: pg.ClientBase }) => {
          setImmediate(() => {
            client.query('UNLISTEN "jobs:insert"').catch(() => {});
          });
        });
      }
      runner = await gw.run({
        noHandleSignals: true,
        logger: new gw.Logger(() => () => {}),
        taskList: { [QUEUE]: (p: { orderId: number }) => onJob(p) },
        preset: {
          worker: {
            connectionString: DATABASE_URL,
            schema,
            events,
            concurrentJobs: concurrency,
            maxPoolSize: Math.max(10, concurrency + 2),
            ...(listen ? {} : { pollInterval: GRAPHILE_POLL_ONLY_INTERVAL_MS }),
            localQueue: { size: GRAPHILE_LOCAL_QUEUE },
            completeJobBatchDelay: 0,
            failJobBatchDelay: 0,
          },
        },
      });
    },
    async stopWorker() {
      await runner?.stop();
    },
    async remaining() {
      return (await admin.query(`SELECT count(*)::int AS n FROM "${schema}"._private_jobs`)).rows[0].n;
    },
    async channel() {
      return "jobs:insert";
    },
    async producer(clients) {
      const pool = new pg.Pool({ connectionString: DATABASE_URL, max: clients });
      pool.on("error", (e) => console.error("graphile producer pool:", e));
      pool.on("connect", (client) =>
        client.on("error", (e) => console.error("graphile producer client:", e)),
      );
      const u = await utils(pool);
      const producer: Producer = {
        publish: async (n) => {
          await u.addJob(QUEUE, payload(n));
        },
        publishBatch: async (from, count) => {
          await u.addJobs(
            Array.from({ length: count }, (_, i) => ({ identifier: QUEUE, payload: payload(from + i) })),
          );
        },
        close: async () => {
          await u.release();
          await pool.end();
        },
      };
      return producer;
    },
    async teardown() {
      await dropSchema(admin, schema);
      await admin.end();
    },
  };
}
