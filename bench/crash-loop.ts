/**
 * Issue 41, item 3: a crash loop dead-letters its neighbours. One poison message (payload {poison: true}, the
 * `--poison-at`th of `--messages` published on one queue, in one transaction) kills its worker with SIGKILL
 * every time it runs. Three worker processes (test/support/fixtures/crash-loop-worker.ts: `maxDeliveries` 5, `concurrency` 4,
 * `batchSize` 20, `leaseTtlMs` `--lease-ttl`, polls 20–200 ms) are restarted by a supervisor loop here
 * whenever one exits, until `messages` is empty (every row acked or dead-lettered) or `--cap` seconds pass.
 * Every handler run is written to a ledger table (id, worker, deliveries, at) before the handler does anything.
 *
 * Prints one JSON line per run of a lease mode:
 *   mode; poisonRuns (ledger rows of the poison message); poisonDeadReason (its dead-letter reason, null if
 *   none); innocentDead (other messages dead-lettered); innocentDeadNeverRan (of those, the ones with no ledger
 *   row: dead-lettered without their handler ever starting); innocentRunsTotal (ledger rows of the others);
 *   innocentRanMoreThanOnce; crashes (worker exits by SIGKILL); left (rows still in `messages` at the end: not
 *   0 only if the cap was hit); seconds (from the first worker's spawn to the empty queue).
 * With `--runs K` each mode runs K times (a fresh schema each time), then one summary line per mode gives the
 * min/median/max of innocentDead and innocentDeadNeverRan. The schema is dropped at the end.
 *
 *   node --import tsx bench/crash-loop.ts [--mode token|transaction] [--runs K]
 *     [--messages 300] [--poison-at 10] [--lease-ttl 2000] [--cap 120]
 */
import { type ChildProcess, spawn } from "node:child_process";
import { fileURLToPath } from "node:url";
import pg from "pg";
import { migrate } from "../src/migrate/migrator.js";
import { createPublisher } from "../src/produce/publisher.js";
import { outboxNames } from "../src/sql/names.js";
import { arg, DATABASE_URL, median, ROOT, sleep } from "./lib.js";

type Mode = "token" | "transaction";
const modeArg = arg("mode", "both");
const modes: Mode[] = modeArg === "both" ? ["transaction", "token"] : [modeArg as Mode];
for (const m of modes) if (m !== "token" && m !== "transaction") throw new Error(`--mode token|transaction`);
const RUNS = Number(arg("runs", "1"));
const MESSAGES = Number(arg("messages", "300"));
const POISON_AT = Number(arg("poison-at", "10"));
const LEASE_TTL = Number(arg("lease-ttl", "2000"));
const CAP_MS = Number(arg("cap", "120")) * 1000;
const WORKERS = 3;
const QUEUE = "crash.loop";
const FIXTURE = fileURLToPath(new URL("../test/support/fixtures/crash-loop-worker.ts", import.meta.url));

const schema = "bench_crash_loop";
const names = outboxNames(schema);
const pool = new pg.Pool({ connectionString: DATABASE_URL, max: 4 });
const outbox = createPublisher({ schema, notify: { cooldownMs: 0 } });

interface Run {
  mode: Mode;
  poisonRuns: number;
  poisonDeadReason: string | null;
  innocentDead: number;
  innocentDeadNeverRan: number;
  innocentRunsTotal: number;
  innocentRanMoreThanOnce: number;
  crashes: number;
  left: number;
  seconds: number;
}

async function fresh(): Promise<string> {
  await pool.query(`DROP SCHEMA IF EXISTS ${names.quotedSchema} CASCADE`);
  await migrate({ connection: DATABASE_URL, schema });
  await pool.query(
    `CREATE TABLE ${names.quotedSchema}.ledger (id bigint NOT NULL, worker text NOT NULL, deliveries int NOT NULL, at timestamptz NOT NULL)`,
  );
  const c = await pool.connect();
  try {
    await c.query("BEGIN");
    const ids = await outbox.publishMany(
      c,
      QUEUE,
      Array.from({ length: MESSAGES + 1 }, (_, i) => ({
        payload: i === POISON_AT - 1 ? { poison: true } : { i },
      })),
    );
    await c.query("COMMIT");
    return ids[POISON_AT - 1] as string;
  } catch (error) {
    await c.query("ROLLBACK").catch(() => {});
    throw error;
  } finally {
    c.release();
  }
}

/** Keeps WORKERS worker processes alive: one that exits is started again, until stop(). */
function supervise(mode: Mode): { crashes(): number; stop(): Promise<void> } {
  let stopping = false;
  let crashes = 0;
  let generation = 0;
  const children = new Set<ChildProcess>();
  const launch = (slot: number) => {
    const child = spawn(process.execPath, ["--import", "tsx", FIXTURE], {
      cwd: ROOT,
      stdio: ["ignore", "ignore", "inherit"],
      env: {
        ...process.env,
        DATABASE_URL,
        OUTBOX_SCHEMA: schema,
        WORKER_ID: `w${slot}-${generation++}`,
        LEASE_MODE: mode,
        LEASE_TTL_MS: String(LEASE_TTL),
      },
    });
    children.add(child);
    child.on("exit", (_code, signal) => {
      children.delete(child);
      if (stopping) return;
      if (signal === "SIGKILL") crashes++;
      setTimeout(() => {
        if (!stopping) launch(slot);
      }, 50);
    });
  };
  for (let slot = 0; slot < WORKERS; slot++) launch(slot);
  return {
    crashes: () => crashes,
    async stop() {
      stopping = true;
      const exits = [...children].map(
        (child) => new Promise<void>((resolve) => child.once("exit", () => resolve())),
      );
      for (const child of children) child.kill("SIGKILL");
      await Promise.all(exits);
    },
  };
}

async function once(mode: Mode): Promise<Run> {
  const poison = await fresh();
  const left = async () =>
    Number((await pool.query(`SELECT count(*)::int AS n FROM ${names.messages}`)).rows[0].n);
  const t0 = performance.now();
  const workers = supervise(mode);
  let remaining = MESSAGES + 1;
  try {
    while (performance.now() - t0 < CAP_MS) {
      remaining = await left();
      if (remaining === 0) break;
      await sleep(100);
    }
  } finally {
    await workers.stop();
  }
  const seconds = (performance.now() - t0) / 1000;
  remaining = await left();
  const one = async (sql: string, params: unknown[] = []) => (await pool.query(sql, params)).rows[0];
  const runs = await one(
    `SELECT count(*) FILTER (WHERE id = $1)::int AS poison,
            count(*) FILTER (WHERE id <> $1)::int AS innocent
       FROM ${names.quotedSchema}.ledger`,
    [poison],
  );
  const dead = await one(
    `SELECT (SELECT reason FROM ${names.deadLetters} WHERE id = $1) AS reason,
            count(*) FILTER (WHERE d.id <> $1)::int AS dead,
            count(*) FILTER (WHERE d.id <> $1
              AND NOT EXISTS (SELECT 1 FROM ${names.quotedSchema}.ledger l WHERE l.id = d.id))::int AS never
       FROM ${names.deadLetters} d`,
    [poison],
  );
  const twice = await one(
    `SELECT count(*)::int AS n FROM (
       SELECT id FROM ${names.quotedSchema}.ledger WHERE id <> $1 GROUP BY id HAVING count(*) > 1) t`,
    [poison],
  );
  return {
    mode,
    poisonRuns: runs.poison,
    poisonDeadReason: dead.reason ?? null,
    innocentDead: dead.dead,
    innocentDeadNeverRan: dead.never,
    innocentRunsTotal: runs.innocent,
    innocentRanMoreThanOnce: twice.n,
    crashes: workers.crashes(),
    left: remaining,
    seconds: Math.round(seconds * 10) / 10,
  };
}

const stats = (xs: number[]) => ({ min: Math.min(...xs), median: median(xs), max: Math.max(...xs) });

try {
  const all: Run[] = [];
  for (const mode of modes) {
    for (let i = 0; i < RUNS; i++) {
      const r = await once(mode);
      all.push(r);
      console.log(JSON.stringify(r));
    }
  }
  if (RUNS > 1) {
    for (const mode of modes) {
      const rs = all.filter((r) => r.mode === mode);
      console.log(
        JSON.stringify({
          mode,
          summary: `${rs.length} runs`,
          innocentDead: stats(rs.map((r) => r.innocentDead)),
          innocentDeadNeverRan: stats(rs.map((r) => r.innocentDeadNeverRan)),
          poisonRuns: stats(rs.map((r) => r.poisonRuns)),
          capHit: rs.filter((r) => r.left > 0).length,
        }),
      );
    }
  }
} finally {
  await pool.query(`DROP SCHEMA IF EXISTS ${names.quotedSchema} CASCADE`);
  await pool.end();
}
