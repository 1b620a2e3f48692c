/**
 * This project, through its public pieces: migrate, createWorker, createPublisher, the optional trigger.
 *
 * Producer modes: "plain" (a bare INSERT as a named prepared statement, no notification: the baseline),
 * "plainUnnamed" (the same INSERT unnamed, as pg sends `client.query(text, values)`), "default" (`publish` with its
 * throttled wake-ups, the default), "silent" (`publish`, wake-ups off), "cooldownN" (throttle window N ms),
 * "every" (`publish` notifying in every transaction), "trigger" (a bare INSERT with the optional notify
 * trigger attached): each single-message publish is `BEGIN; …; COMMIT`, as in a producer's own
 * transaction. "autocommit": `publish(pool, …)`, one autocommit statement, the shape of the peers' enqueue.
 * "keyed": as "default", with an ordering key out of PRODUCER_KEYS keys.
 */
import pg from "pg";
import { createPgLeaseStore } from "../../src/lease/pg-store.js";
import type { LeaseStore } from "../../src/lease/store.js";
import { migrate } from "../../src/migrate/migrator.js";
import { enableNotifyTrigger } from "../../src/migrate/notify-trigger.js";
import { createPublisher } from "../../src/produce/publisher.js";
import { outboxNames } from "../../src/sql/names.js";
import { createWorker, type Worker } from "../../src/worker/worker.js";
import { DATABASE_URL, PAYLOAD_SQL, payload } from "../lib.js";
import { adminPool, dropSchema, keyOf, type Peer, type Producer, QUEUE, vacuumSchema } from "./peer.js";

export interface OutboxTuning {
  batchSize?: number;
}

/** The key space of the "keyed" producer mode: message n is published with key `k<n % 10000>`. */
export const PRODUCER_KEYS = 10_000;

/**
 * Runs a bulk INSERT (one simple-query text, numbers inlined) with the key-head trigger of migration 0003
 * disabled: the INSERT sets `head` itself, as the trigger would (the first row of each key heads it). The
 * trigger takes one advisory lock per key until commit, so one fill statement over more than a few thousand
 * keys would exhaust the lock table (max_locks_per_transaction); and its cost is a producer cost, measured
 * by the "keyed" producer mode, not part of a drain. The three statements run as one implicit transaction.
 */
export async function withoutKeyTrigger(pool: pg.Pool, schema: string, insert: string): Promise<void> {
  const m = outboxNames(schema).messages;
  await pool.query(
    `ALTER TABLE ${m} DISABLE TRIGGER messages_key_head; ${insert}; ALTER TABLE ${m} ENABLE TRIGGER messages_key_head`,
  );
}

/**
 * The worker's lease store on `schema`'s bench queue, for benches that drive the statements themselves (one
 * connection, no handlers): prepared statements, asynchronous commit, a lease long enough for a drain.
 */
export function benchLeaseStore(pool: pg.Pool, schema: string): LeaseStore {
  return createPgLeaseStore({
    pool: () => pool,
    names: outboxNames(schema),
    queues: [QUEUE],
    workerId: "bench",
    leaseTtlMs: 60_000,
    maxErrorLength: 1000,
    synchronousCommit: false,
    preparedStatements: true,
    queryTimeoutMs: 60_000,
  });
}

export function outboxPeer(schema: string): Peer {
  const names = outboxNames(schema);
  const admin = adminPool();
  let worker: Worker | undefined;

  return {
    name: "pg-outbox-worker",
    async setup() {
      await dropSchema(admin, schema);
      await migrate({ connection: DATABASE_URL, schema });
    },
    async fill(rows, keys) {
      if (keys) {
        await withoutKeyTrigger(
          admin,
          schema,
          `INSERT INTO ${names.messages} (queue, payload, key, head)
           SELECT '${QUEUE}', ${PAYLOAD_SQL}, 'k' || (g % ${Number(keys)}), g <= ${Number(keys)}
           FROM generate_series(1, ${Number(rows)}) AS g`,
        );
      } else {
        await admin.query(
          `INSERT INTO ${names.messages} (queue, payload)
           SELECT '${QUEUE}', ${PAYLOAD_SQL} FROM generate_series(1, $1) AS g`,
          [rows],
        );
      }
      await vacuumSchema(admin, schema);
    },
    async startWorker({ concurrency, listen, onJob, tuning }) {
      worker = createWorker({
        connection: DATABASE_URL,
        schema,
        concurrency,
        listen,
        logger: false,
        ...(tuning?.batchSize ? { batchSize: tuning.batchSize } : {}),
        // 1: wait for the WAL flush on the worker's writes, as graphile-worker and pg-boss always do.
        synchronousCommit: tuning?.synchronousCommit === 1,
        // preparedStatements 0: every statement unnamed (planned at each execution), as behind PgBouncer.
        ...(tuning?.preparedStatements === 0 ? { preparedStatements: false } : {}),
        // leaseTransaction 1: leaseMode "transaction" (rows held by the leasing transaction's locks).
        ...(tuning?.leaseTransaction === 1 ? { leaseMode: "transaction" as const } : {}),
        // rawPayload 1: a `rawPayload: true` queue (what every relay is), the stored text unparsed; drain
        // only, whose onJob never reads the payload (latency reads orderId).
        queues: {
          [QUEUE]:
            tuning?.rawPayload === 1
              ? { handler: (p) => onJob(p as { orderId: number }), rawPayload: true }
              : (p) => onJob(p as { orderId: number }),
        },
      });
      await worker.start();
    },
    async stopWorker() {
      await worker?.stop({ timeoutMs: 10_000 });
    },
    async remaining() {
      return (await admin.query(`SELECT count(*)::int AS n FROM ${names.messages}`)).rows[0].n;
    },
    async channel() {
      return names.channel;
    },
    async producer(clients, mode) {
      const pool = new pg.Pool({ connectionString: DATABASE_URL, max: clients + 1 });
      if (mode === "trigger") await enableNotifyTrigger(pool, schema);
      const cooldown = /^cooldown(\d+)$/.exec(mode)?.[1];
      const publisher =
        mode === "every"
          ? createPublisher({ schema, notify: { cooldownMs: 0 } })
          : mode === "silent"
            ? createPublisher({ schema, notify: false })
            : createPublisher({
                schema,
                notify: { connection: pool, ...(cooldown ? { cooldownMs: Number(cooldown) } : {}) },
              });
      const insert = {
        name: "bench_plain_insert",
        text: `INSERT INTO ${names.messages} (queue, payload) VALUES ($1, $2::jsonb) RETURNING id`,
      };
      const inTransaction = async (fn: (client: pg.PoolClient) => Promise<unknown>) => {
        const client = await pool.connect();
        try {
          await client.query("BEGIN");
          await fn(client);
          await client.query("COMMIT");
        } catch (error) {
          await client.query("ROLLBACK").catch(() => {});
          throw error;
        } finally {
          client.release();
        }
      };
      const bare = mode === "plain" || mode === "trigger" || mode === "plainUnnamed";
      // pg's default: `client.query(text, values)`, an unnamed statement, as `publish` sends by default.
      const plainInsert = mode === "plainUnnamed" ? { text: insert.text } : insert;
      const producer: Producer = {
        publish: (n) =>
          mode === "autocommit"
            ? publisher.publish(pool, QUEUE, payload(n)).then(() => {})
            : inTransaction((client) =>
                bare
                  ? client.query({ ...plainInsert, values: [QUEUE, JSON.stringify(payload(n))] })
                  : publisher.publish(
                      client,
                      QUEUE,
                      payload(n),
                      // "keyed": the key's advisory lock (held to commit) and the key-head trigger.
                      mode === "keyed" ? { key: keyOf(n, PRODUCER_KEYS) } : undefined,
                    ),
              ),
        publishBatch: (from, count) =>
          inTransaction((client) =>
            publisher.publishMany(
              client,
              QUEUE,
              Array.from({ length: count }, (_, i) => ({ payload: payload(from + i) })),
            ),
          ),
        close: () => pool.end(),
      };
      return producer;
    },
    async teardown() {
      await dropSchema(admin, schema);
      await admin.end();
    },
  };
}
