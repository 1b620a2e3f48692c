import path from "node:path";
import pg from "pg";
import { z } from "zod";
import { EmbeddedPostgresNotInstalledError, startEmbeddedPostgres } from "../embedded/embedded-postgres.js";
import { peekMessages } from "../inspect/peek.js";
import { migrate } from "../migrate/migrator.js";
import { createPublisher } from "../produce/publisher.js";
import { defineQueue } from "../produce/queue.js";
import { defineTopic, subscriberQueue } from "../produce/topic.js";
import { CREATE_DEMO_ORDERS, CURRENT_SCHEMA, INSERT_DEMO_ORDER } from "../sql/demo.js";
import { runQuery } from "../sql/executor.js";
import { backlogStatement } from "../sql/inspect.js";
import { DEFAULT_SCHEMA, outboxNames } from "../sql/names.js";
import { unprocessedSummaryStatement } from "../sql/peek.js";
import { BEGIN, COMMIT, ROLLBACK } from "../sql/transaction.js";
import { subscribe, subscribersOf } from "../subscribe/subscriptions.js";
import { redactConnectionString } from "../util/redact.js";
import { handle } from "../worker/options.js";
import { createWorker } from "../worker/worker.js";
import { databaseUrlFrom, parseCommandArgs, UsageError } from "./args.js";
import { type CliIo, print, printError } from "./io.js";

export const demoUsage = `Usage: outbox-worker demo [--orders N] [--live SECONDS] [--rate N] [--data-dir DIR] [--database-url URL]

Zero-setup demo. Without DATABASE_URL it starts an embedded Postgres in DIR (default ./.outbox-data,
kept between runs), installs the outbox schema, and places N orders: each one an order row and its
event on the topic order.placed written in ONE transaction. Two queues subscribe to that topic, so each
event becomes one message per queue: order.placed (the exact name) and email.receipts (the pattern
order.*). Every tenth order is rolled back to show that none of its messages appears. It shows what is
waiting through the lease-free unprocessed view, then runs a worker that delivers every message to its
queue's handler. Then, for --live seconds, orders keep coming while the worker relays them, with live
progress: rows/s, backlog, and pickup latency from commit to handler.

With DATABASE_URL (or --database-url) it works in that database: it installs the outbox schema
(OUTBOX_SCHEMA, default "outbox"), subscribes the two queues, and creates the table demo_orders in the
current schema (public by default); all of it stays after the demo (DROP TABLE demo_orders removes the
table, outbox-worker unsubscribe the subscriptions).

Options:
  --orders N           orders to place before the worker starts (default 20)
  --live SECONDS       then place orders live for this long (default 5; 0 skips)
  --rate N             live orders per second (default 200)
  --data-dir DIR       embedded Postgres data folder (default ./.outbox-data)
  --database-url URL   use this Postgres instead of the embedded one
  -h, --help           show this help`;

const order = z.object({
  orderId: z.number().int(),
  customer: z.string(),
  totalCents: z.number().int().nonnegative(),
});

/** The demo's queue; examples/consumers/queues.ts describes the same one for the consumer examples. */
export const orderPlaced = defineQueue("order.placed", order);

/** The topic each order transaction publishes to, once: its subscribers get a message each. */
export const orderPlacedTopic = defineTopic("order.placed", order);

/** The second subscriber: a queue of its own, typed by the topic's schema. */
export const receipts = subscriberQueue(orderPlacedTopic, "email.receipts");

/** Who receives the topic: the existing queue by the exact name, the receipts by the category pattern. */
const SUBSCRIPTIONS = [
  { topic: orderPlacedTopic.topic, queue: orderPlaced.name },
  { topic: "order.*", queue: receipts.name },
] as const;
const SERVED = new Set<string>(SUBSCRIPTIONS.map((s) => s.queue));

/** Subscribes the demo's queues (idempotent) and says which queues an order's event reaches now. */
async function subscribeQueues(pool: pg.Pool, schema: string, io: CliIo, stays: boolean) {
  for (const s of SUBSCRIPTIONS) await subscribe(pool, { ...s, schema });
  const reached = await subscribersOf(pool, orderPlacedTopic, { schema });
  print(
    io,
    `Topic ${orderPlacedTopic.topic}: ${SUBSCRIPTIONS.map((s) => `${s.queue} subscribes to ${s.topic}`).join(", ")}; an order's event reaches ${reached.join(", ")}${stays ? " (the subscriptions stay; outbox-worker unsubscribe <pattern> <queue> removes one)" : ""}`,
  );
}

async function placeOrders(pool: pg.Pool, count: number, schema: string) {
  const outbox = createPublisher({ schema, notify: { connection: pool } });
  let committed = 0;
  let rolledBack = 0;
  for (let i = 1; i <= count; i++) {
    const client = await pool.connect();
    try {
      await client.query(BEGIN.text);
      const customer = `customer-${(i % 4) + 1}`;
      const totalCents = 1000 + ((i * 337) % 9000);
      const { rows } = await client.query<{ id: number }>(INSERT_DEMO_ORDER, [customer, totalCents]);
      const orderId = Number(rows[0]?.id);
      // One event, one message per subscribed queue, all in this transaction.
      await outbox.publishToTopic(
        client,
        orderPlacedTopic,
        { orderId, customer, totalCents },
        { key: customer },
      );
      // Every tenth order fails after publishing: its messages must vanish with it.
      if (i % 10 === 0) {
        await client.query(ROLLBACK.text);
        rolledBack++;
      } else {
        await client.query(COMMIT.text);
        committed++;
      }
    } catch (error) {
      await client.query(ROLLBACK.text).catch(() => {});
      throw error;
    } finally {
      client.release();
    }
  }
  return { committed, rolledBack };
}

async function showOutbox(pool: pg.Pool, schema: string) {
  const states = await runQuery(pool, unprocessedSummaryStatement(outboxNames(schema)), {});
  console.log("\nWaiting in the outbox (SELECT ... FROM %s.unprocessed):", schema);
  console.table(
    states.map((r) => ({
      queue: r.queue,
      state: r.state,
      rows: r.rows,
      oldest: `${r.oldest_s.toFixed(1)} s`,
    })),
  );
  const next = await peekMessages(pool, schema, { limit: 5 });
  console.log("Next in line (peekMessages, oldest first):");
  console.table(
    next.map((m) => ({
      id: m.id,
      queue: m.queue,
      key: m.key,
      state: m.state,
      payload: JSON.stringify(m.payload),
    })),
  );
}

/** Rows in the outbox's messages table: every message not delivered yet. */
async function backlog(pool: pg.Pool, schema: string): Promise<number> {
  const [row] = await runQuery(pool, backlogStatement(outboxNames(schema)), {});
  return row?.n ?? 0;
}

/** Run a worker until the outbox is empty, printing each delivery. */
async function deliver(url: string, pool: pg.Pool, schema: string) {
  const waiting = () => backlog(pool, schema);
  const total = await waiting();
  console.log(`\nStarting a worker to deliver ${total} message(s) to the topic's subscribers ...`);
  let delivered = 0;
  const byQueue = new Map<string, number>([...SERVED].map((q) => [q, 0]));
  const worker = createWorker({
    connection: url,
    schema,
    logger: false,
    queues: {
      // Each subscriber is a queue with a handler of its own (or a relay): its own retries, order, dead letters.
      [orderPlaced.name]: handle(orderPlaced, (order, message) => {
        console.log(
          `  delivered message ${message.id} to ${message.queue}: order ${order.orderId} for ${order.customer} (${(order.totalCents / 100).toFixed(2)})`,
        );
      }),
      [receipts.name]: handle(receipts, (order, message) => {
        console.log(
          `  delivered message ${message.id} to ${message.queue}: receipt of order ${order.orderId} for ${order.customer} (topic ${message.topic})`,
        );
      }),
    },
  });
  worker.on("acked", (e) => {
    delivered++;
    byQueue.set(e.queue, (byQueue.get(e.queue) ?? 0) + 1);
  });
  const started = Date.now();
  await worker.start();
  while ((await waiting()) > 0 && Date.now() - started < 30_000) await new Promise((r) => setTimeout(r, 50));
  await worker.stop();
  const perQueue = [...byQueue].map(([q, n]) => `${q} ${n}`).join(", ");
  console.log(
    `Delivered ${delivered} message(s) (${perQueue}) in ${Date.now() - started} ms; ${await waiting()} left in the outbox.`,
  );
}

function percentile(sorted: number[], p: number): number {
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1))] ?? 0;
}

/** Orders keep arriving while a worker relays them; one progress line a second. */
async function live(
  url: string,
  pool: pg.Pool,
  schema: string,
  seconds: number,
  rate: number,
  interrupted: AbortSignal,
) {
  const outbox = createPublisher({ schema, notify: { connection: pool } });
  const committedAt = new Map<string, number>();
  const startedAt = new Map<string, number>();
  const pickups: number[] = [];
  const record = (id: string) => {
    const c = committedAt.get(id);
    const h = startedAt.get(id);
    if (c === undefined || h === undefined) return;
    pickups.push(Math.max(0, h - c));
    committedAt.delete(id);
    startedAt.delete(id);
  };
  let delivered = 0;
  let copies = 0; // messages committed for the queues this worker serves
  const pickedUp = (_order: unknown, message: { id: string }) => {
    startedAt.set(message.id, performance.now());
    record(message.id);
  };
  const worker = createWorker({
    connection: url,
    schema,
    logger: false,
    queues: {
      [orderPlaced.name]: handle(orderPlaced, pickedUp),
      [receipts.name]: handle(receipts, pickedUp),
    },
  });
  worker.on("acked", () => {
    delivered++;
  });
  await worker.start();
  console.log(
    `\nLive for ${seconds} s: ${rate} orders/s, each to ${SERVED.size} subscribers, while the worker relays them (every 10th rolled back)`,
  );
  const t0 = performance.now();
  let placed = 0;
  let rolledBack = 0;
  let lastDelivered = 0;
  const tick = setInterval(async () => {
    const waiting = await backlog(pool, schema);
    const sorted = [...pickups].sort((a, b) => a - b);
    const elapsed = ((performance.now() - t0) / 1000).toFixed(0).padStart(3);
    console.log(
      `  ${elapsed} s  placed ${String(placed).padStart(6)} (${rolledBack} rolled back)  delivered ${String(delivered).padStart(6)}  ${String(delivered - lastDelivered).padStart(5)} rows/s  backlog ${waiting}  pickup p50 ${percentile(sorted, 50).toFixed(1)} ms p99 ${percentile(sorted, 99).toFixed(1)} ms`,
    );
    lastDelivered = delivered;
  }, 1000);
  const inflight = new Set<Promise<void>>();
  // Ctrl-C ends the live phase like its timer does: no new orders, in-flight ones finish, the worker stops.
  for (let i = 1; performance.now() - t0 < seconds * 1000 && !interrupted.aborted; i++) {
    const due = t0 + (i * 1000) / rate;
    const wait = due - performance.now();
    if (wait > 0) await new Promise((r) => setTimeout(r, wait));
    const order = (async () => {
      const client = await pool.connect();
      try {
        await client.query(BEGIN.text);
        const customer = `customer-${(i % 4) + 1}`;
        const { rows } = await client.query<{ id: number }>(INSERT_DEMO_ORDER, [customer, 1000 + i]);
        const event = await outbox.publishToTopic(client, orderPlacedTopic, {
          orderId: Number(rows[0]?.id),
          customer,
          totalCents: 1000 + i,
        });
        placed++;
        if (i % 10 === 0) {
          await client.query(ROLLBACK.text);
          rolledBack++;
          return;
        }
        await client.query(COMMIT.text);
        for (const { id, queue } of event.messages) {
          if (!SERVED.has(queue)) continue;
          copies++;
          committedAt.set(id, performance.now());
          record(id);
        }
      } finally {
        client.release();
      }
    })();
    inflight.add(order);
    void order.finally(() => inflight.delete(order));
  }
  await Promise.all(inflight);
  const deadline = performance.now() + 10_000;
  while (delivered < copies && performance.now() < deadline && !interrupted.aborted)
    await new Promise((r) => setTimeout(r, 20));
  clearInterval(tick);
  await worker.stop();
  const sorted = [...pickups].sort((a, b) => a - b);
  console.log(
    `Live: placed ${placed}, rolled back ${rolledBack}, delivered ${delivered} message(s) of ${copies} to ${SERVED.size} subscribers; pickup from commit to handler p50 ${percentile(sorted, 50).toFixed(1)} ms, p99 ${percentile(sorted, 99).toFixed(1)} ms.`,
  );
}

export async function demoCommand(argv: string[], io: CliIo): Promise<number> {
  const { values } = parseCommandArgs(argv, {
    orders: { type: "string" },
    live: { type: "string" },
    rate: { type: "string" },
    "data-dir": { type: "string" },
    "database-url": { type: "string" },
  });
  if (values.help) {
    print(io, demoUsage);
    return 0;
  }
  const orders = Number(values.orders ?? 20);
  if (!Number.isInteger(orders) || orders < 1 || orders > 1_000_000) {
    throw new UsageError(
      `--orders must be a whole number from 1 to 1000000, got ${JSON.stringify(values.orders)}`,
    );
  }
  const liveSeconds = Number(values.live ?? 5);
  const rate = Number(values.rate ?? 200);
  if (!Number.isInteger(liveSeconds) || liveSeconds < 0 || liveSeconds > 3600) {
    throw new UsageError(
      `--live must be a whole number of seconds from 0 to 3600, got ${JSON.stringify(values.live)}`,
    );
  }
  if (!Number.isInteger(rate) || rate < 1 || rate > 5000) {
    throw new UsageError(`--rate must be a whole number from 1 to 5000, got ${JSON.stringify(values.rate)}`);
  }
  const schema = io.env.OUTBOX_SCHEMA ?? DEFAULT_SCHEMA;
  outboxNames(schema);

  // Ctrl-C (or SIGTERM) stops at the next step and cleans up: worker, pool, embedded server; a second one
  // exits at once. The embedded server's own signal hooks stay off: they would stop it under the demo.
  const interruption = new AbortController();
  const onSignal = (signal: NodeJS.Signals) => {
    if (interruption.signal.aborted) process.exit(130);
    print(io, `\n${signal}: stopping the demo (the worker, then the database) ...`);
    interruption.abort();
  };
  process.on("SIGINT", onSignal);
  process.on("SIGTERM", onSignal);
  const interrupted = interruption.signal;

  let url = databaseUrlFrom(values["database-url"], io.env);
  let stopEmbedded: (() => Promise<void>) | undefined;
  if (!url) {
    const dataDir = path.resolve((values["data-dir"] as string | undefined) ?? ".outbox-data");
    print(io, `No DATABASE_URL: starting an embedded Postgres in ${dataDir} ...`);
    const started = Date.now();
    let server: Awaited<ReturnType<typeof startEmbeddedPostgres>>;
    try {
      server = await startEmbeddedPostgres({ dataDir, persistent: true, handleSignals: false });
    } catch (error) {
      process.off("SIGINT", onSignal);
      process.off("SIGTERM", onSignal);
      if (error instanceof EmbeddedPostgresNotInstalledError) {
        printError(io, `outbox-worker demo: ${error.message}`);
        return 2;
      }
      throw error;
    }
    print(io, `Embedded Postgres ready on port ${server.port} in ${Date.now() - started} ms`);
    url = server.url;
    stopEmbedded = server.stop;
  }
  const pool = new pg.Pool({ connectionString: url, max: 4, application_name: "outbox-demo" });
  // An idle client cut by the server (say, the embedded one shutting down) must not crash the demo.
  pool.on("error", () => {});
  try {
    print(io, `Database: ${redactConnectionString(url)}`);
    const result = await migrate({ connection: pool, schema });
    print(
      io,
      result.applied.length
        ? `Installed outbox schema "${schema}" (${result.applied.map((m) => m.name).join(", ")})`
        : `Outbox schema "${schema}" is up to date (version ${result.version})`,
    );
    if (stopEmbedded === undefined) {
      // Someone else's database: say what the demo leaves in it.
      const { rows } = await pool.query<{ schema: string }>(CURRENT_SCHEMA);
      print(
        io,
        `Creating table ${rows[0]?.schema ?? "public"}.demo_orders for the demo's orders (it stays; DROP TABLE demo_orders removes it)`,
      );
    }
    await subscribeQueues(pool, schema, io, stopEmbedded === undefined);
    await pool.query(CREATE_DEMO_ORDERS);
    const started = Date.now();
    const { committed, rolledBack } = await placeOrders(pool, orders, schema);
    print(
      io,
      `\nPlaced ${orders} orders in ${Date.now() - started} ms: ${committed} committed (order + a message for each subscriber), ${rolledBack} rolled back (neither).`,
    );
    if (!interrupted.aborted) await showOutbox(pool, schema);
    if (!interrupted.aborted) await deliver(url, pool, schema);
    if (liveSeconds > 0 && !interrupted.aborted)
      await live(url, pool, schema, liveSeconds, rate, interrupted);
    if (interrupted.aborted) {
      print(io, "Demo stopped.");
      return 130;
    }
    return 0;
  } finally {
    await pool.end();
    await stopEmbedded?.();
    process.off("SIGINT", onSignal);
    process.off("SIGTERM", onSignal);
  }
}
