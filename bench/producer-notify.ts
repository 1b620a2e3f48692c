/**
 * What wake-up notifications cost producers: 8 clients run single-row publish transactions for a few
 * seconds in each mode, a worker-like LISTEN connection attached, and the median of several runs is printed.
 * With --statements it compares `publish` on named prepared statements (`preparedStatements: true`) with
 * unnamed ones (the default, which works behind PgBouncer in transaction mode), with wake-ups off and on.
 *
 *   DATABASE_URL=postgres://postgres@127.0.0.1:5432/test npx tsx bench/producer-notify.ts [seconds] [runs] [--statements]
 */
import pg from "pg";
import { migrate } from "../src/migrate/migrator.js";
import { disableNotifyTrigger, enableNotifyTrigger } from "../src/migrate/notify-trigger.js";
import { createPublisher, type Publisher } from "../src/produce/publisher.js";
import { outboxNames } from "../src/sql/names.js";

const url = process.env.DATABASE_URL ?? "postgres://postgres@127.0.0.1:5432/test";
const positional = process.argv.slice(2).filter((a) => !a.startsWith("--"));
const seconds = Number(positional[0] ?? 5);
const runs = Number(positional[1] ?? 3);
const statements = process.argv.includes("--statements");
const CLIENTS = 8;
const schema = "bench_producer";
const names = outboxNames(schema);

interface Mode {
  name: string;
  trigger?: boolean;
  publisher?: (pool: pg.Pool) => Publisher;
}

const notifyModes: Mode[] = [
  { name: "plain INSERT (no notification)" },
  // The default: at most one NOTIFY per queue per 2 ms window, plus a trailing one on its own connection.
  {
    name: "publish, throttled wake-ups (default)",
    publisher: (pool: pg.Pool) => createPublisher({ schema, notify: { connection: pool } }),
  },
  { name: "publish, wake-ups off", publisher: () => createPublisher({ schema, notify: false }) },
  {
    name: "publish, NOTIFY in every transaction",
    publisher: () => createPublisher({ schema, notify: { cooldownMs: 0 } }),
  },
  { name: "plain INSERT + optional trigger", trigger: true },
];

// Named statements are parsed and planned once per connection; unnamed ones on every call.
const statementModes: Mode[] = [
  { name: "plain INSERT (no notification)" },
  // Side by side within each run: unnamed, then named, for each notify setting.
  ...[false, true].flatMap((wakeUps) =>
    [false, true].map((preparedStatements) => ({
      name: `publish, wake-ups ${wakeUps ? "on (default)" : "off"}, ${preparedStatements ? "named prepared" : "unnamed (default)"} statements`,
      publisher: () =>
        createPublisher({ schema, preparedStatements, ...(wakeUps ? {} : { notify: false as const }) }),
    })),
  ),
];

const modes = statements ? statementModes : notifyModes;

async function runMode(pool: pg.Pool, mode: Mode): Promise<number> {
  const publisher = mode.publisher?.(pool);
  const insert = `INSERT INTO ${names.messages} (queue, payload) VALUES ($1, $2::jsonb) RETURNING id`;
  const payload = { orderId: 1, customer: "customer-1", totalCents: 1234, note: "x".repeat(40) };
  const deadline = performance.now() + seconds * 1000;
  let count = 0;
  await Promise.all(
    Array.from({ length: CLIENTS }, async () => {
      const client = await pool.connect();
      try {
        while (performance.now() < deadline) {
          await client.query("BEGIN");
          if (publisher) await publisher.publish(client, "bench.producer", payload);
          else
            await client.query({
              name: "bench_insert",
              text: insert,
              values: ["bench.producer", JSON.stringify(payload)],
            });
          await client.query("COMMIT");
          count++;
        }
      } finally {
        client.release();
      }
    }),
  );
  return count / seconds;
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] ?? 0;

const pool = new pg.Pool({ connectionString: url, max: CLIENTS + 2 });
await pool.query(`DROP SCHEMA IF EXISTS ${names.quotedSchema} CASCADE`);
await migrate({ connection: url, schema });
const listener = new pg.Client({ connectionString: url });
await listener.connect();
let notifications = 0;
listener.on("notification", () => notifications++);
await listener.query(`LISTEN "${names.channel}"`);

const results: Record<string, number[]> = {};
const notes: Record<string, number[]> = {};
for (let r = 0; r < runs; r++) {
  for (const mode of modes) {
    await pool.query(`TRUNCATE ${names.messages}`);
    await pool.query("CHECKPOINT");
    if (mode.trigger) await enableNotifyTrigger(pool, schema);
    notifications = 0;
    const rate = await runMode(pool, mode);
    if (mode.trigger) await disableNotifyTrigger(pool, schema);
    results[mode.name] = [...(results[mode.name] ?? []), rate];
    notes[mode.name] = [...(notes[mode.name] ?? []), notifications / seconds];
  }
}
const base = median(results[modes[0]?.name ?? ""] ?? []);
console.log(`\n${CLIENTS} clients, single-row transactions, ${seconds} s per run, median of ${runs} runs\n`);
console.log("| mode | tx/s (median) | range | vs plain | notifications/s |");
console.log("|---|---:|---:|---:|---:|");
for (const mode of modes) {
  const xs = results[mode.name] ?? [];
  console.log(
    `| ${mode.name} | ${median(xs).toFixed(0)} | ${Math.min(...xs).toFixed(0)}–${Math.max(...xs).toFixed(0)} | ${((median(xs) / base) * 100).toFixed(0)} % | ${median(notes[mode.name] ?? []).toFixed(0)} |`,
  );
}
await listener.end();
await pool.query(`DROP SCHEMA ${names.quotedSchema} CASCADE`);
await pool.end();
