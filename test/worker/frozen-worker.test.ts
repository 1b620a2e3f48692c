// A worker frozen past its leases (SIGSTOP: as a VM pause or a long GC would) must not start, once it
// resumes, the rows it had queued: another worker has taken them meanwhile, and maybe their keys' next rows
// (DESIGN §4 invariant 22). Two worker processes drain keyed messages; one is stopped until its leases (token
// mode) or its batches' transactions (transaction mode) are gone and the other has moved on, then continued.
// The ledger (test/support/fixtures/ordered-worker.ts, server clock) then shows, per key, handler starts in
// id order, and no start by the frozen worker after it resumed of a message the other had already handled.
import { afterAll, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { testDatabase } from "../support/database.js";
import { type OrderedChild, startOrderedChild } from "../support/ordered-children.js";
import { publisherFor, until } from "../support/worker.js";

const db = testDatabase("frozen");
const outbox = publisherFor(db.schema);
const ledger = `"${db.schema}".ledger`;
const KEYS = 40;
const PER_KEY = 12;
const TOTAL = KEYS * PER_KEY;
const TTL = 2000;

type Child = OrderedChild;
const children: Child[] = [];

function startChild(id: string, leaseMode: string): Child {
  return startOrderedChild(
    id,
    {
      DATABASE_URL: db.url,
      OUTBOX_SCHEMA: db.schema,
      LEASE_MODE: leaseMode,
      // Few slots behind a long local queue: most of what the frozen worker holds is queued, not running.
      CONCURRENCY: "2",
      BATCH_SIZE: "40",
      LEASE_TTL_MS: String(TTL),
      PGAPPNAME: `frozen-ledger ${id}`,
    },
    children,
  );
}

const count = async (sql: string, params: unknown[] = []) =>
  (await db.pool.query<{ n: number }>(sql, params)).rows[0]?.n ?? 0;
const nowUs = async () =>
  BigInt(
    (
      await db.pool.query<{ us: string }>(
        "SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint::text AS us",
      )
    ).rows[0]?.us ?? "0",
  );

beforeAll(async () => {
  await db.migrate();
  await db.pool.query(
    `CREATE TABLE "${db.schema}".lost_leases (worker text, id bigint, deliveries int, phase text, at timestamptz)`,
  );
  await db.pool.query(`CREATE TABLE ${ledger} (
    exec bigserial PRIMARY KEY, id bigint NOT NULL, key text NOT NULL, seq int NOT NULL, worker text NOT NULL,
    attempts int NOT NULL, deliveries int NOT NULL, started_at timestamptz NOT NULL, ended_at timestamptz,
    ok boolean
  )`);
});
beforeEach(async () => {
  await db.pool.query(`TRUNCATE ${ledger}, "${db.schema}".lost_leases, ${db.names.messages}`);
});

afterAll(async () => {
  for (const c of children) {
    c.process.kill("SIGCONT");
    c.process.kill("SIGKILL");
  }
  await Promise.all(children.map((c) => c.exited));
});

interface Execution {
  id: string;
  key: string;
  seq: number;
  worker: string;
  started: bigint;
  ended: bigint | null;
  ok: boolean | null;
}

describe.each(["token", "transaction"])("a worker frozen past its leases (leaseMode %s)", (mode) => {
  it("starts none of the rows it had queued once it resumes, and per-key order holds", async () => {
    const messages: { payload: { key: string; seq: number; fail: boolean }; key: string }[] = [];
    for (let seq = 0; seq < PER_KEY; seq++)
      for (let k = 0; k < KEYS; k++)
        messages.push({ payload: { key: `k${k}`, seq, fail: false }, key: `k${k}` });
    await db.inTransaction((c) => outbox.publishMany(c, "ordered", messages));

    const [a, b] = [startChild(`fz-a-${mode}`, mode), startChild(`fz-b-${mode}`, mode)] as [Child, Child];
    await Promise.all([a.ready, b.ready]);
    const handled = () => count(`SELECT count(DISTINCT id)::int AS n FROM ${ledger} WHERE ok`);
    const startedBy = (w: string) => count(`SELECT count(*)::int AS n FROM ${ledger} WHERE worker = $1`, [w]);
    // Both at work, and the one to freeze holding a queue of rows.
    await until(
      async () => (await startedBy(a.id)) >= 10 && (await startedBy(b.id)) >= 10,
      "both workers run",
    );

    a.process.kill("SIGSTOP");
    // More rows held than it has slots: some of them queued, not started (the hazard this test is about).
    const heldAtFreeze = await count(
      `SELECT count(*)::int AS n FROM "${db.schema}".unprocessed WHERE state = 'leased' AND acquired_by = $1`,
      [a.id],
    );
    // Whatever A holds is gone on the server: its token leases expired (token mode), its batches' idle
    // transactions ended by the server (transaction mode)...
    await until(
      async () =>
        mode === "token"
          ? (await count(
              `SELECT count(*)::int AS n FROM ${db.names.messages} WHERE acquired_by = $1 AND lease_expires_at > now()`,
              [a.id],
            )) === 0
          : (await count(
              "SELECT count(*)::int AS n FROM pg_stat_activity WHERE application_name LIKE '%' || $1 || '%' AND state LIKE 'idle in transaction%'",
              [a.id],
            )) === 0,
      "the frozen worker's leases are gone",
      60_000,
    );
    // ... and B has taken over: it has handled messages A had leased.
    const frozenAt = await handled();
    await until(async () => (await handled()) >= Math.min(TOTAL, frozenAt + 60), "B moves on", 60_000);
    const resumedAt = await nowUs();
    a.process.kill("SIGCONT");

    await until(async () => (await handled()) === TOTAL, "every message handled", 120_000);
    for (const c of [a, b]) c.process.kill("SIGTERM");
    await Promise.all([a.exited, b.exited]);

    const { rows } = await db.pool.query<{
      id: string;
      key: string;
      seq: number;
      worker: string;
      started: string;
      ended: string | null;
      ok: boolean | null;
    }>(
      `SELECT id::text, key, seq, worker,
              (extract(epoch FROM started_at) * 1000000)::bigint::text AS started,
              (extract(epoch FROM ended_at) * 1000000)::bigint::text AS ended, ok
       FROM ${ledger} ORDER BY key, started_at, exec`,
    );
    const executions: Execution[] = rows.map((r) => ({
      ...r,
      started: BigInt(r.started),
      ended: r.ended === null ? null : BigInt(r.ended),
    }));
    const violations: string[] = [];
    const byKey = new Map<string, Execution[]>();
    for (const e of executions) byKey.set(e.key, [...(byKey.get(e.key) ?? []), e]);
    for (const [key, list] of byKey) {
      // Starts in id (seq) order: a later message never starts before an earlier one's (last) start.
      for (let i = 1; i < list.length; i++) {
        const prev = list[i - 1] as Execution;
        const e = list[i] as Execution;
        if (e.seq < prev.seq)
          violations.push(
            `${key}: seq ${e.seq} started on ${e.worker} after seq ${prev.seq} on ${prev.worker}`,
          );
      }
      // The frozen worker, resumed, starts nothing the other had handled already.
      for (const e of list) {
        if (e.worker !== a.id || e.started < resumedAt) continue;
        const done = list.find(
          (x) => x.id === e.id && x.worker === b.id && x.ok && (x.ended ?? 0n) < e.started,
        );
        if (done)
          violations.push(
            `${key}: seq ${e.seq} started on ${a.id} after it resumed, though ${b.id} had handled it`,
          );
      }
    }
    const lost = await db.pool.query<{ worker: string; phase: string; n: number }>(
      `SELECT worker, phase, count(*)::int AS n FROM "${db.schema}".lost_leases GROUP BY 1, 2 ORDER BY 1, 2`,
    );
    expect({ violations: violations.slice(0, 20), count: violations.length, lost: lost.rows }).toMatchObject({
      violations: [],
      count: 0,
    });
    expect(heldAtFreeze).toBeGreaterThan(2);
    expect(await count(`SELECT count(*)::int AS n FROM ${db.names.deadLetters}`)).toBe(0);
  });
});
