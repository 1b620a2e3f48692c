import type pg from "pg";
import { outboxNames } from "../../src/sql/names.js";
import { subscribe } from "../../src/subscribe/subscriptions.js";

/** The payload a console must show as text: were it markup, the page would set window.__pwned. */
export const HOSTILE_PAYLOAD = {
  html: '<script>window.__pwned=1</script><img src=x onerror="window.__pwned=2">',
};
export const HOSTILE_ERROR = '<img src=x onerror="window.__pwned=3">boom & <b>bold</b>';

/** What seedConsoleDemo puts in each queue's row of `status` (messages and dead letters). */
export const SEEDED_COUNTS = {
  orders: { ready: 3, scheduled: 1, leased: 1, expired: 1, dead: 2 },
  mail: { ready: 2, scheduled: 0, leased: 2, expired: 0, dead: 1 },
  webhooks: { ready: 1, scheduled: 2, leased: 0, expired: 0, dead: 0 },
} as const;

/** What seedConsoleDemo subscribes: topic pattern → queues. */
export const SEEDED_SUBSCRIPTIONS = [
  { pattern: "customer.signed_up", queues: ["mail"] },
  { pattern: "order.*", queues: ["orders", "webhooks"] },
] as const;

/** Events seedConsoleDemo publishes to topics no queue subscribes to (kept as dead letters no_subscribers). */
export const SEEDED_UNROUTED = { "refund.requested": 2, "invoice.voided": 1 } as const;

/**
 * Messages in three queues in every state (ready, scheduled, leased, an expired lease) and dead letters,
 * one of them with a hostile payload and error, in a migrated, empty schema; two topic subscriptions, and
 * events published by plain SQL to topics nobody subscribes to. Returns the (queue) dead letters' ids.
 */
export async function seedConsoleDemo(
  pool: pg.Pool,
  schema: string,
): Promise<{ hostile: string; others: string[] }> {
  const { messages, deadLetters } = outboxNames(schema);
  const insert = (
    queue: string,
    n: number,
    state: "ready" | "scheduled" | "leased" | "expired",
    worker = "worker-a",
  ) =>
    pool.query(
      `INSERT INTO ${messages} (queue, payload, created_at, available_at, acquired_at, acquired_token, acquired_by,
         lease_expires_at, deliveries_count)
       SELECT $1, jsonb_build_object('order', i, 'queue', $1::text), now() - (i * interval '40 seconds'),
         CASE WHEN $2 = 'scheduled' THEN now() + interval '1 hour' ELSE now() - (i * interval '40 seconds') END,
         CASE WHEN $2 IN ('leased', 'expired') THEN now() - interval '2 minutes' END,
         CASE WHEN $2 IN ('leased', 'expired') THEN gen_random_uuid() END,
         CASE WHEN $2 IN ('leased', 'expired') THEN $3 END,
         CASE WHEN $2 = 'leased' THEN now() + interval '1 hour'
              WHEN $2 = 'expired' THEN now() - interval '30 seconds' END,
         CASE WHEN $2 IN ('leased', 'expired') THEN 1 ELSE 0 END
       FROM generate_series(1, $4::int) AS i`,
      [queue, state, worker, n],
    );
  for (const [queue, counts] of Object.entries(SEEDED_COUNTS)) {
    if (counts.ready) await insert(queue, counts.ready, "ready");
    if (counts.scheduled) await insert(queue, counts.scheduled, "scheduled");
    if (counts.leased) await insert(queue, counts.leased, "leased", "worker-a");
    if (counts.expired) await insert(queue, counts.expired, "expired", "worker-b");
  }
  // Dead letters take their ids from the messages' identity, as the worker's move does.
  const dead = async (queue: string, reason: string, ago: string, error: string, payload: unknown) => {
    const { rows } = await pool.query<{ id: string }>(
      `INSERT INTO ${deadLetters} (id, queue, payload, headers, created_at, available_at, acquired_by,
         deliveries_count, attempts_count, failures_count, dead_at, reason, error)
       VALUES (nextval(pg_get_serial_sequence($1, 'id')), $2, $3, '{}', now() - $4::interval - interval '1 hour',
         now() - $4::interval - interval '1 hour', 'worker-z', 5, 5, 5, now() - $4::interval, $5, $6)
       RETURNING id`,
      [messages, queue, JSON.stringify(payload), ago, reason, error],
    );
    return rows[0]?.id as string;
  };
  const hostile = await dead("orders", "rejected", "2 hours", HOSTILE_ERROR, HOSTILE_PAYLOAD);
  const others = [
    await dead("orders", "retries_exhausted", "3 days", "timeout talking to billing", { order: 41 }),
    await dead("mail", "max_deliveries", "20 minutes", "SMTP 451 try again later", { to: "a@example.com" }),
  ];
  for (const { pattern, queues } of SEEDED_SUBSCRIPTIONS) {
    for (const queue of queues) await subscribe(pool, { schema, topic: pattern, queue });
  }
  for (const [topic, n] of Object.entries(SEEDED_UNROUTED)) {
    await pool.query(
      `INSERT INTO ${messages} (topic, payload)
       SELECT $1::text, jsonb_build_object('topic', $1::text, 'n', i) FROM generate_series(1, $2::int) AS i`,
      [topic, n],
    );
  }
  return { hostile, others };
}
