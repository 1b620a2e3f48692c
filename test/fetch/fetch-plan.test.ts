import { randomUUID } from "node:crypto";
import { beforeAll, describe, expect, it } from "vitest";
import { completeStatements } from "../../src/sql/complete.js";
import { runQuery } from "../../src/sql/executor.js";
import {
  aloneStatement,
  fetchStatement,
  SUSPECT_WALK,
  suspectsWaitingStatement,
} from "../../src/sql/fetch.js";
import { testDatabase } from "../support/database.js";

const db = testDatabase("plan");
const ROWS = 100_000;

/** EXPLAIN the lease statement as the worker runs it (a generic prepared plan, as pg does after 5 runs). */
async function explain(queues: string[], limit: number): Promise<string> {
  const client = await db.pool.connect();
  try {
    const text = fetchStatement(db.names, { synchronousCommit: false }).statement.text;
    await client.query("SET plan_cache_mode = force_generic_plan");
    await client.query(
      `PREPARE lease(text[], int, uuid, double precision, text, text[], bigint, int[]) AS ${text}`,
    );
    await client.query("BEGIN");
    const { rows } = await client.query(
      `EXPLAIN (ANALYZE, COSTS OFF) EXECUTE lease('{${queues.join(",")}}', ${limit}, '${randomUUID()}', 30000, 'explain', '{}', ${Number.MAX_SAFE_INTEGER}, '{${queues.map(() => limit).join(",")}}')`,
    );
    return rows.map((r) => r["QUERY PLAN"]).join("\n");
  } finally {
    // EXPLAIN ANALYZE really leases: roll it back, and leave the pooled connection as we found it.
    await client.query("ROLLBACK");
    await client.query("DEALLOCATE lease");
    await client.query("RESET plan_cache_mode");
    client.release();
  }
}

describe(`the lease statement on ${ROWS} rows`, () => {
  beforeAll(async () => {
    await db.migrate();
    const m = db.names.messages;
    // 90% queue a, 10% queue b; every 50th row leased, every 500th with an expired lease; some scheduled.
    await db.pool.query(`
      INSERT INTO ${m} (queue, payload, available_at)
      SELECT CASE WHEN g % 10 = 0 THEN 'b' ELSE 'a' END,
             jsonb_build_object('n', g, 'pad', repeat('x', 80)),
             CASE WHEN g % 7 = 0 THEN now() + interval '1 hour' ELSE now() - interval '1 minute' END
      FROM generate_series(1, ${ROWS}) AS g;
      UPDATE ${m} SET acquired_token = gen_random_uuid(), acquired_at = now(),
             lease_expires_at = now() + interval '30 seconds', acquired_by = 'other', deliveries_count = 1
      WHERE id % 50 = 1;
      UPDATE ${m} SET lease_expires_at = now() - interval '1 second' WHERE id % 500 = 1;
      ANALYZE ${m};`);
  }, 120_000);

  it("scans messages_due_idx for ready rows", async () => {
    for (const queues of [["a"], ["a", "b"]]) {
      const plan = await explain(queues, 100);
      expect(plan).toMatch(/Index Scan using messages_due_idx on messages/);
      expect(plan).not.toMatch(/Seq Scan/);
      expect(plan).not.toMatch(/Bitmap Heap Scan/);
      // The picked ids join back through the primary key, not a full scan of the table.
      expect(plan).toMatch(/Index Scan using messages_pkey/);
    }
  });

  it("leases ready rows oldest first, never expired or live leases or scheduled rows; an expired one alone", async () => {
    const token = randomUUID();
    const leased = await runQuery(db.pool, fetchStatement(db.names, { synchronousCommit: false }), {
      queues: ["b"],
      limit: 50,
      token: token,
      leaseTtlMs: 30_000,
      workerId: "w-test",
    });
    expect(leased).toHaveLength(50);
    const ids = leased.map((r) => Number(r.id));
    const { rows } = await db.pool.query(
      `SELECT id, acquired_token, acquired_by, deliveries_count, lease_expires_at > now() + interval '29 seconds' AS fresh
       FROM ${db.names.messages} WHERE id = ANY($1::bigint[])`,
      [ids],
    );
    for (const row of rows) {
      expect(row).toMatchObject({ acquired_token: token, acquired_by: "w-test", fresh: true });
      expect(row.deliveries_count).toBe(1);
    }
    // Queue b has no expired leases (ids ≡ 1 mod 500 are never multiples of 10), so these are its 50
    // oldest ready rows: skipping scheduled ones (id % 7 = 0) and live leases.
    const expected: number[] = [];
    for (let id = 10; expected.length < 50; id += 10) if (id % 7 !== 0) expected.push(id);
    expect([...ids].sort((x, y) => x - y)).toEqual(expected);
    // In queue a, row 1's lease expired (held through a crash): a batch leaves it for a lease of its own.
    const a = await runQuery(db.pool, fetchStatement(db.names, { synchronousCommit: false }), {
      queues: ["a"],
      limit: 5,
      token: randomUUID(),
      leaseTtlMs: 30_000,
      workerId: "w",
    });
    expect(a.map((r) => Number(r.id)).sort((x, y) => x - y)).toEqual([2, 3, 4, 5, 6]);
    const alone = await runQuery(db.pool, aloneStatement(db.names, { synchronousCommit: false }), {
      queues: ["a"],
      token: randomUUID(),
      leaseTtlMs: 30_000,
      workerId: "w",
    });
    // The oldest expired lease, counting its second delivery.
    expect(alone.map((r) => [Number(r.id), r.deliveries_count])).toEqual([[1, 2]]);
  });
});

describe(`the look for rows held through a crash on ${ROWS} rows`, () => {
  const big = testDatabase("planalone");
  beforeAll(async () => {
    await big.migrate();
    const m = big.names.messages;
    // A backlog of ready rows and no expired lease: the look must still read a bounded walk, not all.
    await big.pool.query(`
      INSERT INTO ${m} (queue, payload, available_at)
      SELECT 'a', jsonb_build_object('n', g), now() - interval '1 minute' FROM generate_series(1, ${ROWS}) AS g;
      ANALYZE ${m};`);
  }, 120_000);

  it("walks messages_due_idx at most SUSPECT_WALK rows per queue, whatever the backlog", async () => {
    const client = await big.pool.connect();
    try {
      await client.query("SET plan_cache_mode = force_generic_plan");
      await client.query(
        `PREPARE look(text[], text[], uuid[]) AS ${suspectsWaitingStatement(big.names).statement.text}`,
      );
      const { rows } = await client.query("EXPLAIN (ANALYZE, COSTS OFF) EXECUTE look('{a}', '{}', '{}')");
      const plan = rows.map((r) => r["QUERY PLAN"]).join("\n");
      expect(plan).toMatch(/Index Scan using messages_due_idx on messages/);
      expect(plan).not.toMatch(/Seq Scan|Bitmap Heap Scan/);
      const walked = plan.split("\n").find((l) => l.includes("messages_due_idx")) ?? "";
      expect(Number(/actual time=[\d.]+\.\.[\d.]+ rows=(\d+)/.exec(walked)?.[1])).toBe(SUSPECT_WALK);
    } finally {
      await client.query("DEALLOCATE look");
      await client.query("RESET plan_cache_mode");
      client.release();
    }
  });
});

const HOT = 100_000;
const OTHER_KEYS = 10_000;

describe(`per-key ordering with one hot key of ${HOT} rows and ${OTHER_KEYS} other keys`, () => {
  const hot = testDatabase("planhot");

  /** EXPLAIN (ANALYZE, BUFFERS) of a statement as the worker runs it, rolled back. */
  async function explainHot(text: string, types: string, args: string): Promise<string> {
    const client = await hot.pool.connect();
    try {
      await client.query("SET plan_cache_mode = force_generic_plan");
      await client.query(`PREPARE s(${types}) AS ${text}`);
      await client.query("BEGIN");
      const { rows } = await client.query(`EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) EXECUTE s(${args})`);
      return rows.map((r) => r["QUERY PLAN"]).join("\n");
    } finally {
      await client.query("ROLLBACK");
      await client.query("DEALLOCATE s");
      await client.query("RESET plan_cache_mode");
      client.release();
    }
  }

  beforeAll(async () => {
    await hot.migrate();
    const m = hot.names.messages;
    // The hot key's rows come first (the oldest): a fetch that walked them would read all 100k.
    await hot.pool.query(`
      INSERT INTO ${m} (queue, payload, key, available_at)
      SELECT 'q', jsonb_build_object('n', g), 'hot', now() - interval '1 hour' FROM generate_series(1, ${HOT}) AS g;
      INSERT INTO ${m} (queue, payload, key, available_at)
      SELECT 'q', jsonb_build_object('n', g), 'k' || (g % ${OTHER_KEYS}), now() - interval '1 minute'
      FROM generate_series(1, ${OTHER_KEYS * 3}) AS g;
      ANALYZE ${m};`);
  }, 180_000);

  it("a fetch reads the heads only: it never walks the hot key's backlog", async () => {
    const text = fetchStatement(hot.names, { synchronousCommit: false }).statement.text;
    const plan = await explainHot(
      text,
      "text[], int, uuid, double precision, text, text[], bigint, int[]",
      `'{q}', 500, '${randomUUID()}', 30000, 'explain', '{}', ${Number.MAX_SAFE_INTEGER}, '{500}'`,
    );
    expect(plan).toMatch(/Index Scan using messages_due_idx on messages/);
    expect(plan).not.toMatch(/Seq Scan|Bitmap Heap Scan/);
    // The ready branch returns the batch (the hot key's head and 499 others) and reads about as many
    // index entries: the hot key's 99,999 waiting rows are not in this index at all.
    const ready = plan.split("\n").find((l) => l.includes("messages_due_idx")) ?? "";
    expect(Number(/actual time=[\d.]+\.\.[\d.]+ rows=(\d+)/.exec(ready)?.[1])).toBeLessThanOrEqual(500);
    const hits = [...plan.matchAll(/Buffers: shared hit=(\d+)(?: read=(\d+))?/g)].map(
      (b) => Number(b[1]) + Number(b[2] ?? 0),
    );
    // A few thousand buffers at most for a 500-row lease (locks and updates included); walking the hot
    // key would touch its 100k rows' pages.
    expect(Math.max(...hits)).toBeLessThan(10_000);
  });

  it("an ack's successor look-up starts above the deleted head: none of the key's deleted rows is read again", async () => {
    const m = hot.names.messages;
    const statements = completeStatements(hot.names, { synchronousCommit: true });
    const client = await hot.pool.connect();
    // This transaction's reads of the key index so far (its own statistics, counted as they happen).
    const keyIndexReads = async () =>
      Number(
        (
          await client.query(`SELECT pg_stat_get_xact_tuples_returned($1::regclass) AS n`, [
            `${hot.names.quotedSchema}.messages_key_idx`,
          ])
        ).rows[0].n,
      );
    try {
      await client.query("BEGIN");
      // The hot key's head leased, then acked 20 times in a row in one transaction, each ack handing the next
      // row on: every row deleted here leaves two index entries (as published, as leased) that no one can
      // prune before this transaction ends, so a look-up from the start of the key would read them all.
      let token = randomUUID();
      await client.query(
        `UPDATE ${m} SET acquired_token = $1, acquired_at = now(), lease_expires_at = now() + interval '1 minute'
         WHERE id = 1`,
        [token],
      );
      let id = "1";
      const perAck: number[] = [];
      for (let i = 0; i < 20; i++) {
        const next = randomUUID();
        const before = await keyIndexReads();
        const rows = await runQuery(client, statements.ackKeyHeads, {
          ids: `{${id}}`,
          tokens: `{${token}}`,
          queues: "{q}",
          keys: "{hot}",
          limit: 1,
          token: next,
          leaseTtlMs: 60_000,
          workerId: "w",
        });
        perAck.push((await keyIndexReads()) - before);
        const handed = rows.flatMap((r) => (r.kind === "promoted" && r.taken ? [r.id] : []));
        expect(handed.map(Number)).toEqual([Number(id) + 1]);
        id = handed[0] as string;
        token = next;
      }
      // The successor's own entry (and none of the 2 × 19 entries of the rows deleted before it).
      expect(Math.max(...perAck)).toBeLessThanOrEqual(1);
    } finally {
      await client.query("ROLLBACK");
      client.release();
    }
  });

  it("promoting the hot key's successor reads two index entries, not its backlog", async (ctx) => {
    const text = completeStatements(hot.names, { synchronousCommit: true }).promote.statement.text;
    // The promotion runs inside a function (promote_heads): auto_explain shows the plan of its UPDATE,
    // sent to this session as log messages.
    const client = await hot.pool.connect();
    const notices: string[] = [];
    const onNotice = (n: { message?: string }) => notices.push(n.message ?? "");
    client.on("notice", onNotice);
    try {
      try {
        await client.query("LOAD 'auto_explain'");
      } catch (error) {
        // A server without the contrib module (some embedded builds): say so, never pass silently.
        console.warn(
          `fetch-plan.test: skipping the promotion plan, auto_explain unavailable (${String(error)})`,
        );
        ctx.skip();
      }
      // sample_rate too: a server set to explain a sample of statements would leave some plans out.
      await client.query(`SET auto_explain.log_min_duration = 0; SET auto_explain.log_analyze = on;
        SET auto_explain.log_nested_statements = on; SET auto_explain.log_timing = off;
        SET auto_explain.sample_rate = 1; SET client_min_messages = log`);
      await client.query("BEGIN");
      // The hot key's head as if just deleted in this transaction: promote picks the oldest row left.
      await client.query(`DELETE FROM ${hot.names.messages} WHERE id = 1`);
      // Promoted and handed off to the caller (limit 1), as a worker with room does. Several calls: the
      // function's cached plan turns generic after five.
      for (let i = 0; i < 7; i++) {
        notices.length = 0;
        await client.query({ text, values: [["q"], ["hot"], 1, randomUUID(), 30000, "w"] });
        if (i === 0) {
          const head = await client.query(
            `SELECT id, acquired_by FROM ${hot.names.messages} WHERE key = 'hot' AND head`,
          );
          expect(head.rows.map((r) => [String(r.id), r.acquired_by])).toEqual([["2", "w"]]);
        }
        const plan = notices.find((n) => n.includes("Update on messages")) ?? "";
        expect(plan).toMatch(/Index (Only )?Scan using messages_key_idx/);
        expect(plan).not.toMatch(/Seq Scan|Bitmap Heap Scan/);
        // The only sort ranks the new heads (one per key completed) for the hand-off: one row here.
        for (const sort of plan.matchAll(/Sort \(actual rows=(\d+)/g))
          expect(Number(sort[1])).toBeLessThanOrEqual(1);
      }
    } finally {
      await client.query("ROLLBACK");
      await client.query("RESET ALL");
      client.off("notice", onNotice);
      client.release();
    }
  });
});
