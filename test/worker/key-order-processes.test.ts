// Per-key FIFO across worker processes, end to end on a real Postgres: several child processes (concurrency
// 16 each) drain 200 keys × 50 messages with random handler times and first-attempt failures, one of them is
// killed with SIGKILL midway (lease 3 s) and replaced. Every execution of a handler is in a ledger on the
// server clock (see test/support/fixtures/ordered-worker.ts); the checks read the ledger afterwards: every message
// handled, and per key the executions never overlap and follow id order, each starting only after the
// previous message's last execution ended.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { testDatabase } from "../support/database.js";
import { type OrderedChild, startOrderedChild } from "../support/ordered-children.js";
import { publisherFor, until } from "../support/worker.js";

const db = testDatabase("kop");
const outbox = publisherFor(db.schema);
const QUEUE = "ordered";
const KEYS = 200;
const PER_KEY = 50;
const TOTAL = KEYS * PER_KEY;
const ledger = `"${db.schema}".ledger`;

type Child = OrderedChild;
const children: Child[] = [];

function startChild(id: string): Child {
  return startOrderedChild(
    id,
    {
      DATABASE_URL: db.url,
      OUTBOX_SCHEMA: db.schema,
      // Names the child's ledger sessions after it too (the worker names its own).
      PGAPPNAME: `kop-ledger ${id}`,
    },
    children,
  );
}

/** Seeded, so a run's set of failing messages can be reproduced. */
function mulberry32(seed: number): () => number {
  let a = seed;
  return () => {
    a = (a + 0x6d2b79f5) | 0;
    let t = Math.imul(a ^ (a >>> 15), 1 | a);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const keyName = (k: number) => `k${String(k).padStart(3, "0")}`;

/** One round: message `seq` of every key, interleaved across keys (keys in a shuffled order). */
async function publishRound(seq: number, random: () => number, failing: { n: number }) {
  const order = Array.from({ length: KEYS }, (_, k) => k);
  for (let i = order.length - 1; i > 0; i--) {
    const j = Math.floor(random() * (i + 1));
    [order[i], order[j]] = [order[j] as number, order[i] as number];
  }
  const messages = order.map((k) => {
    const fail = random() < 0.2;
    if (fail) failing.n++;
    return { payload: { key: keyName(k), seq, fail }, key: keyName(k) };
  });
  await db.inTransaction((c) => outbox.publishMany(c, QUEUE, messages));
}

async function count(sql: string, params: unknown[] = []): Promise<number> {
  return (await db.pool.query<{ n: number }>(sql, params)).rows[0]?.n ?? 0;
}

/**
 * Waits until `done` holds, while the messages keep moving: fails when the queue's messages and the ledger
 * have not changed for `stallMs` (a key whose successor is never released stalls the run), naming the
 * messages' states, or after `timeoutMs` in any case.
 */
async function whileProgressing(
  done: () => Promise<boolean>,
  what: string,
  timeoutMs: number,
  stallMs = 60_000,
) {
  const deadline = Date.now() + timeoutMs;
  let last = "";
  let changedAt = Date.now();
  while (!(await done())) {
    const { rows } = await db.pool.query<{ s: string }>(
      `SELECT (SELECT count(*) FROM ${ledger})::text || '/' || (SELECT count(*) FROM ${db.names.messages})::text AS s`,
    );
    const now = rows[0]?.s ?? "";
    if (now !== last) {
      last = now;
      changedAt = Date.now();
    }
    if (Date.now() - changedAt > stallMs || Date.now() > deadline) {
      const states = await db.pool.query<{ state: string; n: number }>(
        `SELECT state, count(*)::int AS n FROM "${db.schema}".unprocessed WHERE queue = $1 GROUP BY state ORDER BY state`,
        [QUEUE],
      );
      const handled = await count(`SELECT count(DISTINCT id)::int AS n FROM ${ledger} WHERE ok`);
      throw new Error(
        `${Date.now() > deadline ? `timed out after ${timeoutMs} ms` : `no progress for ${stallMs} ms`} waiting for: ${what}; ` +
          `${handled} of ${TOTAL} messages handled, left by state: ${states.rows.map((r) => `${r.state} ${r.n}`).join(", ")}`,
      );
    }
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

/** The child's database sessions (its worker's, its listener's, its ledger pool's). */
const sessionsOf = (id: string) =>
  count("SELECT count(*)::int AS n FROM pg_stat_activity WHERE application_name LIKE '%' || $1 || '%'", [id]);

beforeAll(async () => {
  await db.migrate();
  await db.pool.query(
    `CREATE TABLE "${db.schema}".lost_leases (worker text, id bigint, deliveries int, phase text, at timestamptz)`,
  );
  await db.pool.query(`CREATE TABLE ${ledger} (
    exec bigserial PRIMARY KEY,
    id bigint NOT NULL,
    key text NOT NULL,
    seq int NOT NULL,
    worker text NOT NULL,
    attempts int NOT NULL,
    deliveries int NOT NULL,
    started_at timestamptz NOT NULL,
    ended_at timestamptz,
    ok boolean
  )`);
});

afterAll(async () => {
  for (const c of children) c.process.kill("SIGKILL");
  await Promise.all(children.map((c) => c.exited));
});

interface Execution {
  exec: number;
  id: bigint;
  key: string;
  seq: number;
  worker: string;
  attempts: number;
  started: bigint; // µs since epoch, server clock
  ended: bigint | null;
  ok: boolean | null;
}

describe("per-key order across worker processes", () => {
  it("200 keys × 50 messages, 3 processes of 16, 20 % first-attempt failures, one SIGKILLed and replaced", async () => {
    const random = mulberry32(0x5eed);
    const failing = { n: 0 };
    // Half the rounds before the workers start, the rest while they run (producers and completions of one
    // key then meet on its lock).
    for (let seq = 0; seq < PER_KEY / 2; seq++) await publishRound(seq, random, failing);

    const started = Date.now();
    const first = ["kop-a", "kop-b", "kop-c"].map(startChild);
    await Promise.all(first.map((c) => c.ready));
    for (let seq = PER_KEY / 2; seq < PER_KEY; seq++) await publishRound(seq, random, failing);

    const succeeded = () => count(`SELECT count(DISTINCT id)::int AS n FROM ${ledger} WHERE ok`);
    await whileProgressing(
      async () => (await succeeded()) >= TOTAL * 0.35,
      "35 % of the messages handled",
      240_000,
    );

    // Kill one process mid-run. Its sessions end only after the statements they run (a statement it sent
    // just before may still commit): once none is left, nothing of it can write any more, and that instant
    // ends every execution of it that has no end in the ledger.
    const victim = first[0] as Child;
    const progressAtKill = await succeeded();
    victim.process.kill("SIGKILL");
    await victim.exited;
    await until(async () => (await sessionsOf(victim.id)) === 0, "the killed process's sessions have ended");
    const deadAt = BigInt(
      (
        await db.pool.query<{ us: string }>(
          "SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint::text AS us",
        )
      ).rows[0]?.us ?? "0",
    );
    const heldByVictim = await count(
      `SELECT count(*)::int AS n FROM ${db.names.messages} WHERE acquired_by = $1`,
      [victim.id],
    );
    const replacement = startChild("kop-d");
    await replacement.ready;

    await until(
      async () =>
        (await count(`SELECT count(*)::int AS n FROM ${db.names.messages} WHERE queue = $1`, [QUEUE])) === 0,
      "every message acknowledged",
      240_000,
    );
    const elapsedMs = Date.now() - started;

    const alive = [...first.slice(1), replacement];
    for (const c of alive) c.process.kill("SIGTERM");
    const codes = await Promise.all(alive.map((c) => c.exited));

    // --- The ledger. ---
    const { rows } = await db.pool.query<{
      exec: string;
      id: string;
      key: string;
      seq: number;
      worker: string;
      attempts: number;
      started: string;
      ended: string | null;
      ok: boolean | null;
    }>(
      `SELECT exec::text, id::text, key, seq, worker, attempts,
              (extract(epoch FROM started_at) * 1000000)::bigint::text AS started,
              (extract(epoch FROM ended_at) * 1000000)::bigint::text AS ended, ok
       FROM ${ledger} ORDER BY key, started_at, exec`,
    );
    const executions: Execution[] = rows.map((r) => ({
      exec: Number(r.exec),
      id: BigInt(r.id),
      key: r.key,
      seq: r.seq,
      worker: r.worker,
      attempts: r.attempts,
      started: BigInt(r.started),
      ended: r.ended === null ? null : BigInt(r.ended),
      ok: r.ok,
    }));
    const at = (us: bigint) =>
      new Date(Number(us / 1000n)).toISOString().slice(11, 23) + String(us % 1000n).padStart(3, "0");
    const describeExec = (e: Execution, end: bigint) =>
      `id ${e.id} (seq ${e.seq}, ${e.worker}, attempts ${e.attempts}, ${e.ok === null ? "no end" : e.ok ? "ok" : "failed"}) ${at(e.started)}–${at(end)}`;

    const violations: string[] = [];
    const byKey = new Map<string, Execution[]>();
    for (const e of executions) {
      const list = byKey.get(e.key) ?? [];
      list.push(e);
      byKey.set(e.key, list);
    }
    let killedOpen = 0;
    let redelivered = 0;
    for (const [key, list] of byKey) {
      // Ids follow publishing order within a key.
      const idOfSeq = new Map<number, bigint>();
      for (const e of list) idOfSeq.set(e.seq, e.id);
      for (let s = 1; s < PER_KEY; s++) {
        const a = idOfSeq.get(s - 1);
        const b = idOfSeq.get(s);
        if (a !== undefined && b !== undefined && !(a < b))
          violations.push(
            `${key}: seq ${s - 1} has id ${a}, seq ${s} has id ${b} (ids not in publish order)`,
          );
      }
      if (idOfSeq.size !== PER_KEY)
        violations.push(`${key}: executions of ${idOfSeq.size} of its ${PER_KEY} messages in the ledger`);

      let prev: { e: Execution; end: bigint } | undefined;
      const doneSeqs = new Set<number>();
      for (const e of list) {
        let end = e.ended;
        if (end === null) {
          if (e.worker !== victim.id) {
            violations.push(
              `${key}: ${describeExec(e, e.started)} never ended but its process was not killed`,
            );
            end = e.started;
          } else {
            killedOpen++;
            end = e.started > deadAt ? e.started : deadAt;
          }
        }
        if (prev !== undefined) {
          if (e.seq < prev.e.seq)
            violations.push(
              `${key}: ${describeExec(e, end)} started after ${describeExec(prev.e, prev.end)} (a later id ran first)`,
            );
          if (e.started < prev.end)
            violations.push(`${key}: ${describeExec(e, end)} overlaps ${describeExec(prev.e, prev.end)}`);
          if (e.seq > prev.e.seq && !doneSeqs.has(prev.e.seq))
            violations.push(
              `${key}: ${describeExec(e, end)} started, but seq ${prev.e.seq}'s last execution ${describeExec(prev.e, prev.end)} did not succeed`,
            );
        }
        if (doneSeqs.has(e.seq)) {
          redelivered++;
          // Handled again after a success: only when the success's ack died with the killed process.
          const success = list.find((x) => x.seq === e.seq && x.ok === true && x.exec !== e.exec);
          if (success !== undefined && success.worker !== victim.id)
            violations.push(
              `${key}: ${describeExec(e, end)} ran again after ${describeExec(success, success.ended ?? 0n)} succeeded in a live process`,
            );
        }
        if (e.ok === true) doneSeqs.add(e.seq);
        prev = { e, end };
      }
      for (let s = 0; s < PER_KEY; s++)
        if (!doneSeqs.has(s)) violations.push(`${key}: seq ${s} (id ${idOfSeq.get(s)}) never succeeded`);
    }

    const deadLetters = await count(`SELECT count(*)::int AS n FROM ${db.names.deadLetters}`);
    const handled = await count(`SELECT count(DISTINCT id)::int AS n FROM ${ledger} WHERE ok`);
    const failedFirst = await count(`SELECT count(DISTINCT id)::int AS n FROM ${ledger} WHERE ok = false`);
    const summary = {
      elapsedMs,
      progressAtKill,
      heldByVictim,
      killedOpen,
      redelivered,
      executions: executions.length,
      failing: failing.n,
      failedFirst,
    };
    // Visible with --reporter=verbose or on failure; what the run exercised.
    console.log("key-order-processes", JSON.stringify(summary));

    if (violations.length > 0) {
      // What the live processes lost: a lease run out under load explains an overlap; nothing else does.
      const lost = await db.pool.query(`SELECT * FROM "${db.schema}".lost_leases ORDER BY at`);
      console.error("violations", violations, "lost leases", lost.rows);
    }
    expect(violations.slice(0, 25), `${violations.length} violations`).toEqual([]);
    expect(byKey.size).toBe(KEYS);
    expect(handled).toBe(TOTAL);
    expect(deadLetters).toBe(0);
    expect(failedFirst).toBe(failing.n);
    // The kill hit a busy process: it held leases that had to run out before their keys moved on.
    expect(heldByVictim).toBeGreaterThan(0);
    expect(codes).toEqual([0, 0, 0]);
  }, 600_000);
});
