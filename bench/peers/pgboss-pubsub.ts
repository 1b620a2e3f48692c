/**
 * pg-boss 12's own pub/sub, default options: `createQueue(name)` (no `notify`, pg-boss's default),
 * `subscribe(event, name)`, then `publish(event, data)`: one SELECT of the event's queues, then one `send`
 * per queue, each its own autocommit statement, run at once on the pool (not one transaction: a failure
 * can leave some subscribers with the job and others without). Pool: `max` = the producer clients, as the
 * single-queue pg-boss producer row of bench/run.ts.
 *
 * Loaded from bench/node_modules at run time (the root typecheck does not see bench's dependencies).
 */
import { DATABASE_URL, payload } from "../lib.js";
import { adminPool, dropSchema } from "./peer.js";

interface Boss {
  on(event: string, fn: (e: unknown) => void): void;
  start(): Promise<unknown>;
  stop(options?: { graceful?: boolean; timeout?: number; close?: boolean }): Promise<void>;
  createQueue(name: string, options?: Record<string, unknown>): Promise<void>;
  subscribe(event: string, name: string): Promise<void>;
  publish(event: string, data?: object): Promise<void>;
  send(name: string, data: object): Promise<string | null>;
}
type BossClass = new (options: Record<string, unknown>) => Boss;

const MODULE = "pg-boss";
const load = async () => ((await import(MODULE)) as { PgBoss: BossClass }).PgBoss;

export interface PgBossPubSub {
  /** `publish(event, payload(n))` to every subscribed queue. */
  publish(n: number): Promise<void>;
  /** `send(queue, payload(n))` to the first subscribed queue only: pg-boss's own one-queue baseline. */
  send(n: number): Promise<void>;
  /** Jobs stored in the subscribed queues. */
  jobs(): Promise<number>;
  teardown(): Promise<void>;
}

/** A fresh pg-boss schema with `subscribers` queues subscribed to `event`, and one started instance. */
export async function pgbossPubSub(
  schema: string,
  event: string,
  subscribers: number,
  clients: number,
): Promise<PgBossPubSub> {
  const admin = adminPool();
  await dropSchema(admin, schema);
  const PgBoss = await load();
  const boss = new PgBoss({ connectionString: DATABASE_URL, schema, max: clients, schedule: false });
  boss.on("error", (e) => console.error("pg-boss error:", e));
  await boss.start();
  const queues = Array.from({ length: subscribers }, (_, i) => `bench-sub${i}`);
  for (const q of queues) {
    await boss.createQueue(q);
    await boss.subscribe(event, q);
  }
  const first = queues[0] ?? "bench-sub0";
  return {
    publish: (n) => boss.publish(event, payload(n)),
    send: async (n) => {
      await boss.send(first, payload(n));
    },
    async jobs() {
      const { rows } = await admin.query(
        `SELECT count(*)::int AS n FROM "${schema}".job WHERE name = ANY($1::text[])`,
        [queues],
      );
      return rows[0].n;
    },
    async teardown() {
      await boss.stop({ graceful: false, timeout: 1000 });
      await dropSchema(admin, schema);
      await admin.end();
    },
  };
}
