// Takes docs/console.png: seeds a demo schema, runs a worker on it for a few seconds (so the chart has
// something to draw), serves the console and photographs it in headless Chromium, then drops the schema.
//   DATABASE_URL=postgres://postgres@127.0.0.1:5432/test npx tsx scripts/console-screenshot.ts
import { randomBytes } from "node:crypto";
import { stat } from "node:fs/promises";
import pg from "pg";
import pino from "pino";
import { createConsole } from "../src/console/console.js";
import { createHistory } from "../src/console/history.js";
import { migrate } from "../src/migrate/migrator.js";
import { startHttpServer } from "../src/service/http-server.js";
import { createMetrics } from "../src/service/metrics.js";
import { createReadiness } from "../src/service/readiness.js";
import { outboxNames } from "../src/sql/names.js";
import { createWorker } from "../src/worker/worker.js";
import { launchChromium } from "./support/chromium.js";
import { seedConsoleDemo } from "./support/console-seed.js";

const OUT = "docs/console.png";
const url = process.env.DATABASE_URL ?? "postgres://postgres@127.0.0.1:5432/test";
const schema = `console_demo_${randomBytes(4).toString("hex")}`;
const token = randomBytes(18).toString("base64url");
const silent = pino({ level: "silent" });
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

const pool = new pg.Pool({ connectionString: url, max: 6 });
const cleanups: (() => Promise<unknown>)[] = [];
try {
  await migrate({ connection: pool, schema });
  cleanups.push(() => pool.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`));
  await seedConsoleDemo(pool, schema);

  const worker = createWorker({
    connection: pool,
    schema,
    logger: false,
    concurrency: 4,
    minPollIntervalMs: 50,
    maxPollIntervalMs: 200,
    queues: {
      invoices: async () => {
        await sleep(15);
      },
    },
  });
  const history = createHistory({ db: pool, schema, intervalMs: 250 });
  history.observe(worker);
  history.start();
  cleanups.push(() => history.stop());
  const metrics = createMetrics({ pool, schema, logger: silent });
  const readiness = createReadiness({ pool, schema, listen: true });
  const server = await startHttpServer({
    port: 0,
    metrics,
    readiness,
    logger: silent,
    console: createConsole({ db: pool, schema, pathPrefix: "/console", writeToken: token, history }),
  });
  cleanups.push(() => server.close());
  await worker.start();
  cleanups.push(() => worker.stop({ timeoutMs: 2000 }));

  // Bursts of work for the chart: the backlog rises and drains while the worker delivers.
  const { messages } = outboxNames(schema);
  for (const burst of [120, 60, 200, 40, 150, 90]) {
    await pool.query(
      `INSERT INTO ${messages} (queue, payload) SELECT 'invoices', jsonb_build_object('invoice', i)
       FROM generate_series(1, $1::int) AS i`,
      [burst],
    );
    await sleep(1500);
  }
  await sleep(2500);

  const browser = await launchChromium();
  cleanups.push(() => browser.close());
  const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
  await page.goto(`http://127.0.0.1:${server.port}/console/`);
  await page.fill("#token", token);
  await page.click("#token-save");
  await page.locator('#queues tr[data-queue="orders"]').waitFor();
  await page.locator("#chart polyline").first().waitFor();
  await page.locator('#dead button[data-action="replay"]:not([disabled])').first().waitFor();
  await page.screenshot({ path: OUT, fullPage: true });
  console.log(`${OUT}: ${Math.round((await stat(OUT)).size / 1024)} KB`);
} finally {
  for (const cleanup of cleanups.reverse()) await cleanup().catch((error) => console.error(error));
  await pool.end();
}
