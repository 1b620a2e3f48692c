/**
 * What a worker holds with large rows (issue 26): N rows of about `--kb` KB each inserted up front, one
 * worker (batchSize 500 by default) with `--concurrency` handlers that each take `--handler-ms`; time until
 * every row is acknowledged. Per run: the worker process's peak RSS (VmHWM, the worker alone in a fresh
 * process), the most rows it held at once (`worker.held`, sampled every 10 ms) and the most rows leased in
 * the table (sampled by this process every 20 ms). Payloads: `random` (random hex digits, the same in
 * every row: pglz cannot shrink them, so the stored size is the text's) or `compressible` (one repeated
 * letter: stored ~90× smaller than its text). The handler takes the parsed payload (the default). `--trees`
 * runs the worker of other checkouts (e.g. the code before a change: `git archive <commit> | tar -x -C
 * /tmp/before`, plus a node_modules symlink), interleaved run by run.
 *
 *   node --import tsx bench/held-bytes.ts --rows 500 --kb 1000 --concurrency 10 --handler-ms 200 --runs 3
 *   node --import tsx bench/held-bytes.ts --trees /tmp/before,/tmp/after --payload random,compressible
 *   (--max-held-bytes N passes that worker option: a checkout without it refuses it.)
 */
import { spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { readFileSync } from "node:fs";
import path from "node:path";
import pg from "pg";
import { migrate } from "../src/migrate/migrator.js";
import { outboxNames } from "../src/sql/names.js";
import { arg, DATABASE_URL, machine, median, RESULT_MARK, ROOT, range, sleep } from "./lib.js";

interface Spec {
  tree: string;
  schema: string;
  rows: number;
  concurrency: number;
  batchSize: number;
  handlerMs: number;
  maxHeldBytes?: number;
}

interface RunResult {
  seconds: number;
  peakRssMb: number;
  maxHeld: number;
  maxLeased?: number;
}

const MB = 2 ** 20;

/** The child: one worker of `spec.tree`, alone in this process, draining the filled schema. */
async function child(spec: Spec): Promise<RunResult> {
  const { createWorker } = (await import(
    path.resolve(spec.tree, "src/worker/worker.ts")
  )) as typeof import("../src/worker/worker.js");
  let acked = 0;
  let finish!: () => void;
  const done = new Promise<void>((resolve) => {
    finish = resolve;
  });
  const worker = createWorker({
    connection: DATABASE_URL,
    schema: spec.schema,
    concurrency: spec.concurrency,
    batchSize: spec.batchSize,
    logger: false,
    ...(spec.maxHeldBytes === undefined ? {} : { maxHeldBytes: spec.maxHeldBytes }),
    queues: { big: () => sleep(spec.handlerMs) },
  } as Parameters<typeof createWorker>[0]);
  worker.on("acked", () => {
    if (++acked === spec.rows) finish();
  });
  let maxHeld = 0;
  const sampler = setInterval(() => {
    maxHeld = Math.max(maxHeld, worker.held);
  }, 10);
  const started = performance.now();
  await worker.start();
  await done;
  const seconds = (performance.now() - started) / 1000;
  clearInterval(sampler);
  await worker.stop();
  const hwm = /VmHWM:\s+(\d+) kB/.exec(readFileSync("/proc/self/status", "utf8"))?.[1];
  return { seconds, peakRssMb: (Number(hwm) * 1024) / MB, maxHeld };
}

if (process.argv[2]?.startsWith("{")) {
  const result = await child(JSON.parse(process.argv[2]) as Spec);
  process.stdout.write(`${RESULT_MARK}${JSON.stringify(result)}\n`);
  process.exit(0);
}

const rows = Number(arg("rows", "500"));
const kb = Number(arg("kb", "1000"));
const runs = Number(arg("runs", "3"));
const concurrency = Number(arg("concurrency", "10"));
const batchSize = Number(arg("batch", "500"));
const handlerMs = Number(arg("handler-ms", "200"));
const maxHeldBytes = process.argv.includes("--max-held-bytes")
  ? Number(arg("max-held-bytes", ""))
  : undefined;
const trees = arg("trees", ".").split(",");
const payloads = arg("payload", "random").split(",");
for (const p of payloads) if (p !== "random" && p !== "compressible") throw new Error(`--payload: ${p}`);

const schema = "bench_held_bytes";
const names = outboxNames(schema);
const pool = new pg.Pool({ connectionString: DATABASE_URL, max: 2 });
await pool.query(`DROP SCHEMA IF EXISTS ${names.quotedSchema} CASCADE`);
await migrate({ connection: DATABASE_URL, schema });

/** Random hex digits, made once: every row stores its own copy, which pglz cannot shrink. */
const randomText = randomBytes(kb * 500).toString("hex");

async function fill(kind: string): Promise<{ textKb: number; storedKb: number }> {
  await pool.query(`TRUNCATE ${names.messages}`);
  // About kb × 1000 characters of payload text per row.
  await pool.query(
    `INSERT INTO ${names.messages} (queue, payload)
     SELECT 'big', jsonb_build_object('i', g, 'data', coalesce($3::text, repeat(chr(97 + g % 26), $2::int * 1000)))
     FROM generate_series(1, $1::int) AS g`,
    [rows, kb, kind === "random" ? randomText : null],
  );
  await pool.query(`VACUUM ANALYZE ${names.messages}`);
  const { rows: sizes } = await pool.query(
    `SELECT avg(octet_length(payload::text))::float8 / 1000 AS text, avg(pg_column_size(payload))::float8 / 1000 AS stored
     FROM ${names.messages}`,
  );
  return { textKb: sizes[0].text, storedKb: sizes[0].stored };
}

async function runOnce(tree: string): Promise<RunResult> {
  const spec: Spec = { tree, schema, rows, concurrency, batchSize, handlerMs, maxHeldBytes };
  let maxLeased = 0;
  let sampling = true;
  const sampler = (async () => {
    while (sampling) {
      const { rows: r } = await pool.query(
        `SELECT count(*)::int AS n FROM ${names.messages} WHERE acquired_token IS NOT NULL`,
      );
      maxLeased = Math.max(maxLeased, r[0].n);
      await sleep(20);
    }
  })();
  const result = await new Promise<RunResult>((resolve, reject) => {
    const p = spawn(process.execPath, ["--import", "tsx", "bench/held-bytes.ts", JSON.stringify(spec)], {
      cwd: ROOT,
      stdio: ["ignore", "pipe", "inherit"],
    });
    let out = "";
    p.stdout.on("data", (chunk: Buffer) => {
      out += chunk.toString();
    });
    p.on("close", (code) => {
      const line = out.split("\n").find((l) => l.startsWith(RESULT_MARK));
      if (code !== 0 || !line) reject(new Error(`run failed (exit ${code}) for ${tree}`));
      else resolve(JSON.parse(line.slice(RESULT_MARK.length)) as RunResult);
    });
  });
  sampling = false;
  await sampler;
  return { ...result, maxLeased };
}

console.log(
  `# held bytes: ${rows} rows of ~${kb} KB, concurrency ${concurrency}, ${handlerMs} ms handlers, batchSize ${batchSize}` +
    `${maxHeldBytes === undefined ? "" : `, maxHeldBytes ${maxHeldBytes}`}, ${runs} runs; ${await machine(pool)}\n`,
);
console.log(
  "| payload | tree | text / stored KB per row | rows held, max (median, range) | rows leased, max | peak RSS MB (median, range) | drain s (median) |",
);
console.log("|---|---|---:|---:|---:|---:|---:|");
for (const kind of payloads) {
  const results = new Map(trees.map((t) => [t, [] as RunResult[]]));
  let sizes = { textKb: 0, storedKb: 0 };
  // Trees alternate within each run, so drift of a shared machine hits them alike.
  for (let r = 0; r < runs; r++) {
    for (const t of trees) {
      sizes = await fill(kind);
      results.get(t)?.push(await runOnce(t));
    }
  }
  for (const [t, xs] of results) {
    const held = xs.map((x) => x.maxHeld);
    const rss = xs.map((x) => x.peakRssMb);
    console.log(
      `| ${kind} | ${t} | ${sizes.textKb.toFixed(0)} / ${sizes.storedKb.toFixed(0)} | ${median(held)} (${range(held)}) | ` +
        `${median(xs.map((x) => x.maxLeased ?? 0))} | ${median(rss).toFixed(0)} (${range(rss)}) | ${median(xs.map((x) => x.seconds)).toFixed(1)} |`,
    );
  }
}
await pool.query(`DROP SCHEMA ${names.quotedSchema} CASCADE`);
await pool.end();
