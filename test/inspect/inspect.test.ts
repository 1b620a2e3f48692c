import pg from "pg";
import { beforeAll, describe, expect, it } from "vitest";
import { parseDuration } from "../../src/cli/dead-letters-command.js";
import { peekMessages } from "../../src/inspect/peek.js";
import { topicStatus } from "../../src/inspect/subscriptions-status.js";
import { migrate } from "../../src/migrate/migrator.js";
import { outboxNames } from "../../src/sql/names.js";
import { subscribe } from "../../src/subscribe/subscriptions.js";
import { type CliResult, runCli } from "../support/cli-in-process.js";
import { listen, testDatabase } from "../support/database.js";

const db = testDatabase("insp");

/**
 * Run the CLI as a user would, on the test database, in-process (main(argv, io): same output, same exit
 * code as the binary); never throws on a non-zero exit.
 */
function cli(args: string[], env: Record<string, string | undefined> = {}): Promise<CliResult> {
  return runCli(args, {
    ...process.env,
    DATABASE_URL: db.url,
    OUTBOX_SCHEMA: undefined,
    PGOPTIONS: undefined,
    ...env,
  });
}

const ERROR_TRACE =
  "boom\n    at handler (billing.ts:42:13)\n    at dispatch (worker.ts:10:5)\n    at process (node:internal)";
// Keys in jsonb's own order (shorter first), so the text Postgres gives back is this object's JSON.
const BIG_PAYLOAD = { note: "x".repeat(120), orderId: 7 };

interface Seeded {
  schema: string;
  /** Messages, by name: s1 scheduled, l1 leased, r2 ready (retried), e1 lease expired, r1 ready. */
  m: Record<"s1" | "l1" | "r2" | "e1" | "r1", string>;
  /** Dead letters: d1 orders 10 d old, d2 orders 3 d, d3 mail 1 h, d4 mail 30 s. */
  d: Record<"d1" | "d2" | "d3" | "d4", string>;
}

async function firstId(sql: string, values: unknown[] = []): Promise<string> {
  const { rows } = await db.pool.query<{ id: string }>(sql, values);
  const id = rows[0]?.id;
  if (id === undefined) throw new Error(`no id from ${sql}`);
  return id;
}

/** A fresh, migrated schema, empty. */
async function emptySchema(tag: string): Promise<string> {
  const schema = db.freshSchema(tag);
  await migrate({ connection: db.pool, schema });
  return schema;
}

/**
 * A fresh schema with a message in every state and four dead letters. Messages are inserted newest first,
 * so "oldest first" cannot pass by sorting on id.
 */
async function seeded(tag: string): Promise<Seeded> {
  const schema = await emptySchema(tag);
  const { messages, deadLetters } = outboxNames(schema);
  const insert = `INSERT INTO ${messages} (queue, payload, key, created_at, available_at, acquired_at, acquired_token,
    acquired_by, lease_expires_at, deliveries_count, attempts_count, failures_count, last_error)`;
  const s1 = await firstId(`${insert} VALUES ('orders', '{"n":"s1"}', NULL, now(), now() + interval '1 hour',
    NULL, NULL, NULL, NULL, 0, 0, 0, NULL) RETURNING id`);
  const l1 = await firstId(`${insert} VALUES ('mail', '{"n":"l1"}', NULL, now() - interval '1 minute',
    now() - interval '1 minute', now(), gen_random_uuid(), 'worker-a', now() + interval '1 hour', 1, 0, 0, NULL)
    RETURNING id`);
  const r2 = await firstId(
    `${insert} VALUES ('orders', $1, 'customer-1', now() - interval '2 minutes', now() - interval '2 minutes',
    NULL, NULL, NULL, NULL, 2, 2, 1, $2) RETURNING id`,
    [BIG_PAYLOAD, ERROR_TRACE],
  );
  const e1 = await firstId(`${insert} VALUES ('mail', '{"n":"e1"}', NULL, now() - interval '8 minutes',
    now() - interval '8 minutes', now() - interval '5 minutes', gen_random_uuid(), 'worker-b',
    now() - interval '1 minute', 2, 0, 0, NULL) RETURNING id`);
  const r1 = await firstId(`${insert} VALUES ('orders', '{"n":"r1"}', NULL, now() - interval '10 minutes',
    now() - interval '5 minutes', NULL, NULL, NULL, NULL, 0, 0, 0, NULL) RETURNING id`);

  // Dead letters take their ids from the messages' identity, as the worker's move does.
  const dead = (
    queue: string,
    reason: string,
    ago: string,
    error: string | null,
    payload: unknown,
    key: string | null = null,
    headers: Record<string, string> = {},
  ) =>
    firstId(
      `INSERT INTO ${deadLetters} (id, queue, payload, headers, key, created_at, available_at, acquired_by,
         deliveries_count, attempts_count, failures_count, first_attempt_at, last_attempt_at, dead_at, reason, error)
       VALUES (nextval(pg_get_serial_sequence($1, 'id')), $2, $3, $4, $5, now() - $6::interval - interval '1 hour',
         now() - $6::interval - interval '1 hour', 'worker-z', 5, 4, 3, now() - $6::interval - interval '30 minutes',
         now() - $6::interval, now() - $6::interval, $7, $8)
       RETURNING id`,
      [messages, queue, JSON.stringify(payload), headers, key, ago, reason, error],
    );
  const d1 = await dead("orders", "retries_exhausted", "10 days", "timeout talking to billing", { n: "d1" });
  const d2 = await dead("orders", "rejected", "3 days", "order 7 refused", { n: "d2" });
  const d3 = await dead("mail", "rejected", "1 hour", ERROR_TRACE, BIG_PAYLOAD, "k-9", {
    traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
  });
  const d4 = await dead("mail", "max_deliveries", "30 seconds", null, { n: "d4" });
  return { schema, m: { s1, l1, r2, e1, r1 }, d: { d1, d2, d3, d4 } };
}

/** Everything a lease-free read must leave as it was, row versions (xmin) included. */
async function snapshot(schema: string) {
  const { messages, deadLetters } = outboxNames(schema);
  const m = await db.pool.query(
    `SELECT id, xmin::text AS xmin, deliveries_count, attempts_count, acquired_token, lease_expires_at, available_at
     FROM ${messages} ORDER BY id`,
  );
  const d = await db.pool.query(`SELECT id, xmin::text AS xmin FROM ${deadLetters} ORDER BY id`);
  return { messages: m.rows, deadLetters: d.rows };
}

async function ids(table: string): Promise<string[]> {
  const { rows } = await db.pool.query<{ id: string }>(`SELECT id FROM ${table} ORDER BY id`);
  return rows.map((r) => r.id);
}

function lines(text: string): string[] {
  return text.trimEnd().split("\n");
}

describe("outbox-worker status", () => {
  let s: Seeded;
  beforeAll(async () => {
    s = await seeded("st");
  });

  it("prints per-queue counts and the oldest ready age as an aligned table (schema from OUTBOX_SCHEMA)", async () => {
    const out = await cli(["status"], { OUTBOX_SCHEMA: s.schema });
    expect(out.stderr).toBe("");
    expect(out.code).toBe(0);
    const [tables, health] = out.stdout.split("\nmessages table: ");
    const [queues, workers] = (tables ?? "").split("\n\n");
    expect(`${queues}\n`).toBe(
      [
        "QUEUE   READY  BLOCKED  SCHEDULED  LEASED  EXPIRED  DEAD  OLDEST DEAD  OLDEST READY",
        "mail        0        0          0       1        1     2          1 h             -",
        "orders      2        0          1       0        0     2         10 d         5 min",
        "",
      ].join("\n"),
    );
    // Per worker: worker-a's lease is seconds old and live, worker-b's five minutes old and expired.
    const workerLines = (workers ?? "").split("\n");
    expect(workerLines[0]).toBe("WORKER    HELD  EXPIRED  OLDEST LEASE");
    expect(workerLines[1]).toMatch(/^worker-a\s+1\s+0\s+[\d.]+ s$/);
    expect(workerLines[2]).toMatch(/^worker-b\s+1\s+1\s+5 min$/);
    // Then the table's health line (its figures: test/inspect/table-health.test.ts).
    expect(health).toMatch(/^[\d,]+ dead tuples, .+\n$/);
  });

  it("--json prints the queues (numeric fields, ages in seconds), workers, topics and table health", async () => {
    const out = await cli(["status", "--json", "--schema", s.schema]);
    expect(out.code).toBe(0);
    const status = JSON.parse(out.stdout);
    expect(Object.keys(status)).toEqual(["queues", "workers", "subscriptions", "unrouted", "table"]);
    expect(status.workers.map((w: { worker: string }) => w.worker)).toEqual(["worker-a", "worker-b"]);
    expect(status.subscriptions).toEqual([]);
    expect(status.unrouted).toEqual({ events: 0, topics: 0, byTopic: [] });
    expect(status.table).toMatchObject({
      dead_tuples: expect.any(Number),
      autovacuum_enabled: expect.any(Boolean),
    });
    const rows = status.queues;
    expect(rows).toEqual([
      {
        queue: "mail",
        ready: 0,
        blocked: 0,
        scheduled: 0,
        leased: 1,
        expired: 1,
        dead: 2,
        oldest_dead_age_s: expect.any(Number),
        oldest_ready_age_s: null,
      },
      {
        queue: "orders",
        ready: 2,
        blocked: 0,
        scheduled: 1,
        leased: 0,
        expired: 0,
        dead: 2,
        oldest_dead_age_s: expect.any(Number),
        oldest_ready_age_s: expect.any(Number),
      },
    ]);
    // mail's oldest dead letter (d3) died an hour ago, orders' (d1) ten days ago.
    expect(rows[0].oldest_dead_age_s).toBeGreaterThanOrEqual(3600);
    expect(rows[0].oldest_dead_age_s).toBeLessThan(3660);
    expect(rows[1].oldest_dead_age_s).toBeGreaterThanOrEqual(10 * 86_400);
    expect(rows[1].oldest_dead_age_s).toBeLessThan(10 * 86_400 + 60);
    expect(rows[1].oldest_ready_age_s).toBeGreaterThanOrEqual(300);
    expect(rows[1].oldest_ready_age_s).toBeLessThan(360);
  });

  it('says "no messages" for an empty outbox, and empty lists in JSON', async () => {
    const schema = await emptySchema("st0");
    const table = await cli(["status", "--schema", schema]);
    expect(table.code).toBe(0);
    expect(table.stdout).toMatch(/^no messages\nmessages table: [\d,]+ dead tuples, .+\n$/);
    expect(JSON.parse((await cli(["status", "--schema", schema, "--json"])).stdout)).toMatchObject({
      queues: [],
      workers: [],
      subscriptions: [],
      unrouted: { events: 0, topics: 0, byTopic: [] },
    });
  });
});

describe("outbox-worker status: topics", () => {
  /**
   * Subscriptions, and four events from plain-SQL producers: one fanned out to three queues, three kept as
   * dead letters no_subscribers (refund.requested twice, two hours ago; refund.done five minutes ago).
   */
  async function withTopics(tag: string): Promise<string> {
    const schema = await emptySchema(tag);
    const { messages, deadLetters } = outboxNames(schema);
    for (const [topic, queue] of [
      ["order.*", "billing"],
      ["order.*", "mail"],
      ["order.placed", "audit"],
      ["payment.#", "billing"],
    ] as const) {
      await subscribe(db.pool, { schema, topic, queue });
    }
    await db.pool.query(
      `INSERT INTO ${messages} (topic, payload) VALUES ('order.placed', '{"n":1}'), ('refund.requested', '{"n":2}'),
         ('refund.requested', '{"n":3}'), ('refund.done', '{"n":4}')`,
    );
    await db.pool.query(
      `UPDATE ${deadLetters} SET dead_at = now() - CASE queue WHEN 'refund.done' THEN interval '5 minutes'
         ELSE interval '2 hours' END`,
    );
    // A dead letter of another reason: a queue's, not a kept event.
    await db.pool.query(
      `INSERT INTO ${deadLetters} (id, queue, payload, headers, created_at, available_at, deliveries_count,
         attempts_count, failures_count, reason)
       VALUES (nextval(pg_get_serial_sequence($1, 'id')), 'mail', '{}', '{}', now(), now(), 1, 1, 1, 'rejected')`,
      [messages],
    );
    return schema;
  }

  it("shows each topic pattern's queues and the events kept for want of a subscriber, with how to replay them", async () => {
    const schema = await withTopics("stt");
    const out = await cli(["status", "--schema", schema]);
    expect(out.stderr).toBe("");
    expect(out.code).toBe(0);
    const sections = out.stdout.split("\n\n");
    // Queues first (the kept events count there too, under their topic, as dead-letters list shows them).
    expect(sections[0]?.split("\n").map((l) => l.split(/\s+/).slice(0, 7).join(" "))).toEqual([
      "QUEUE READY BLOCKED SCHEDULED LEASED EXPIRED DEAD",
      "audit 1 0 0 0 0 0",
      "billing 1 0 0 0 0 0",
      "mail 1 0 0 0 0 1",
      "refund.done 0 0 0 0 0 1",
      "refund.requested 0 0 0 0 0 2",
    ]);
    expect(sections[1]).toBe(
      [
        "TOPIC         SUBSCRIBED QUEUES",
        "order.*       billing, mail",
        "order.placed  audit",
        "payment.#     billing",
      ].join("\n"),
    );
    const [kept, health] = (sections[2] ?? "").split("\nmessages table: ");
    expect(kept).toBe(
      [
        "UNROUTED TOPIC    EVENTS  OLDEST",
        "refund.requested       2     2 h",
        "refund.done            1   5 min",
        "3 events kept as dead letters no_subscribers: no queue subscribed to their topic. " +
          "Subscribe one, then: outbox-worker dead-letters replay --reason no_subscribers",
      ].join("\n"),
    );
    expect(health).toMatch(/^[\d,]+ dead tuples, /);
    expect(sections).toHaveLength(3);

    // The hint works: once a queue subscribes, the replay it names fans them out and the section goes.
    await subscribe(db.pool, { schema, topic: "refund.#", queue: "refunds" });
    const replay = await cli(["dead-letters", "replay", "--reason", "no_subscribers", "--schema", schema]);
    expect(replay.code).toBe(0);
    const after = await cli(["status", "--schema", schema]);
    expect(after.stdout).not.toContain("UNROUTED TOPIC");
    expect(after.stdout).toMatch(/\nrefunds +3 /);
    expect(after.stdout).toContain("refund.#      refunds");
  });

  it("--json carries the same: pattern → queues, and the kept events per topic with their totals", async () => {
    const schema = await withTopics("stj");
    const out = await cli(["status", "--json", "--schema", schema]);
    expect(out.code).toBe(0);
    const status = JSON.parse(out.stdout);
    expect(status.subscriptions).toEqual([
      { pattern: "order.*", queues: ["billing", "mail"] },
      { pattern: "order.placed", queues: ["audit"] },
      { pattern: "payment.#", queues: ["billing"] },
    ]);
    expect(status.unrouted).toEqual({
      events: 3,
      topics: 2,
      byTopic: [
        { topic: "refund.requested", events: 2, oldest_age_s: expect.any(Number) },
        { topic: "refund.done", events: 1, oldest_age_s: expect.any(Number) },
      ],
    });
    expect(status.unrouted.byTopic[0].oldest_age_s).toBeGreaterThanOrEqual(7200);
    expect(status.unrouted.byTopic[0].oldest_age_s).toBeLessThan(7260);
    // The library lists the topics with most events first, up to its limit; the totals count them all.
    const top = await topicStatus(db.pool, schema, { limit: 1 });
    expect(top.unrouted).toMatchObject({ events: 3, topics: 2, byTopic: [{ topic: "refund.requested" }] });
    await expect(topicStatus(db.pool, schema, { limit: 0 })).rejects.toThrow(/limit: must be a whole number/);
  });

  it("a role that may not read subscriptions gets them as not shown, the kept events still counted", async () => {
    const schema = await withTopics("str");
    const role = `insp_nosubs_${Math.random().toString(36).slice(2, 8)}`;
    const { quotedSchema, messages, deadLetters } = outboxNames(schema);
    await db.pool.query(`CREATE ROLE ${role} NOLOGIN`);
    try {
      await db.pool.query(`GRANT USAGE ON SCHEMA ${quotedSchema} TO ${role}`);
      // What status reads (and its version check), subscriptions left out.
      await db.pool.query(
        `GRANT SELECT ON ${messages}, ${deadLetters}, ${quotedSchema}.leases, ${quotedSchema}.schema_migrations TO ${role}; GRANT EXECUTE ON FUNCTION ${quotedSchema}.batch_leased() TO ${role}`,
      );
      const out = await cli(["status", "--schema", schema], { PGOPTIONS: `-c role=${role}` });
      expect(out.stderr).toBe("");
      expect(out.code).toBe(0);
      expect(out.stdout).toContain(
        `\n\nsubscriptions: not shown (this role may not read ${schema}.subscriptions)\n`,
      );
      expect(out.stdout).toContain("3 events kept as dead letters no_subscribers");
      const json = JSON.parse(
        (await cli(["status", "--json", "--schema", schema], { PGOPTIONS: `-c role=${role}` })).stdout,
      );
      expect(json.subscriptions).toBeNull();
      expect(json.unrouted.events).toBe(3);
    } finally {
      await db.pool.query(`DROP OWNED BY ${role}`);
      await db.pool.query(`DROP ROLE ${role}`);
    }
  });

  it("shows a kept topic's control characters escaped (dead_letters.queue is free text)", async () => {
    const schema = await emptySchema("stx");
    const { messages, deadLetters } = outboxNames(schema);
    await db.pool.query(
      `INSERT INTO ${deadLetters} (id, queue, payload, headers, created_at, available_at, deliveries_count,
         attempts_count, failures_count, reason)
       VALUES (nextval(pg_get_serial_sequence($1, 'id')), $2, '{}', '{}', now(), now(), 0, 0, 0, 'no_subscribers')`,
      [messages, "evil\u001b[2J\rtopic"],
    );
    const out = await cli(["status", "--schema", schema]);
    expect(out.code).toBe(0);
    expect(out.stdout).toContain("evil\\u001b[2J\\rtopic");
    expect(out.stdout).not.toContain("\u001b");
  });
});

describe("outbox-worker peek", () => {
  let s: Seeded;
  beforeAll(async () => {
    s = await seeded("pk");
  });

  it("lists every state oldest first in aligned columns, cutting long errors and payloads", async () => {
    const out = await cli(["peek", "--schema", s.schema]);
    expect(out.stderr).toBe("");
    expect(out.code).toBe(0);
    const [header = "", ...rows] = lines(out.stdout);
    expect(header).toMatch(/^ID\s+QUEUE\s+KEY\s+STATE\s+AGE\s+DELIVERIES\s+ATTEMPTS\s+LAST ERROR\s+PAYLOAD$/);
    const expected = [
      [s.m.r1, "orders", "ready"],
      [s.m.e1, "mail", "lease_expired"],
      [s.m.r2, "orders", "ready"],
      [s.m.l1, "mail", "leased"],
      [s.m.s1, "orders", "scheduled"],
    ];
    expect(rows).toHaveLength(expected.length);
    const at = (name: string) => header.indexOf(name);
    rows.forEach((row, i) => {
      const [id, queue, state] = expected[i] ?? [];
      expect(row.slice(0, at("QUEUE")).trim()).toBe(id);
      expect(row.slice(at("QUEUE")).startsWith(`${queue} `)).toBe(true);
      expect(row.slice(at("STATE")).startsWith(`${state} `)).toBe(true);
    });
    const retried = rows[2] ?? "";
    expect(retried.slice(at("KEY")).startsWith("customer-1")).toBe(true);
    expect(retried).toContain("2 min");
    // The multi-line error stays on its row, escaped and cut; the payload is cut to 60 characters.
    expect(retried.slice(at("LAST ERROR"))).toMatch(/^boom\\n {4}at handler \(billing\.ts:42:13\)…/);
    expect(retried).not.toContain("worker.ts");
    const payload = retried.slice(at("PAYLOAD"));
    expect(payload).toHaveLength(60);
    expect(payload.startsWith('{"note":"xxxx')).toBe(true);
    expect(payload.endsWith("…")).toBe(true);
  });

  it("--json gives whole rows; --queue, --state and --limit filter", async () => {
    const all = await cli(["peek", "--schema", s.schema, "--json"]);
    expect(all.code).toBe(0);
    const rows = JSON.parse(all.stdout) as Record<string, unknown>[];
    expect(rows.map((r) => r.id)).toEqual([s.m.r1, s.m.e1, s.m.r2, s.m.l1, s.m.s1]);
    expect(rows[2]).toMatchObject({
      id: s.m.r2,
      queue: "orders",
      key: "customer-1",
      state: "ready",
      payload: BIG_PAYLOAD,
      last_error: ERROR_TRACE,
      deliveries_count: 2,
      attempts_count: 2,
      failures_count: 1,
    });
    expect(rows[2]?.age_s).toBeGreaterThanOrEqual(120);
    expect(rows[2]?.age_s).toBeLessThan(180);
    expect(rows[3]).toMatchObject({
      state: "leased",
      acquired_by: "worker-a",
      lease_expires_at: expect.any(String),
    });

    const pick = async (...args: string[]) =>
      (
        JSON.parse((await cli(["peek", "--schema", s.schema, "--json", ...args])).stdout) as { id: string }[]
      ).map((r) => r.id);
    expect(await pick("--state", "scheduled")).toEqual([s.m.s1]);
    expect(await pick("--state", "lease_expired")).toEqual([s.m.e1]);
    expect(await pick("--queue", "mail")).toEqual([s.m.e1, s.m.l1]);
    expect(await pick("--queue", "orders", "--state", "ready", "--limit", "1")).toEqual([s.m.r1]);
    expect(await pick("--limit", "2")).toEqual([s.m.r1, s.m.e1]);
    expect((await cli(["peek", "--schema", s.schema, "--queue", "nothing-here"])).stdout).toBe(
      "no messages\n",
    );
  });

  it("rejects a bad --state, --limit or flag with exit 2 and the usage, before connecting", async () => {
    const unreachable = { DATABASE_URL: "postgres://u:canary-pw@127.0.0.1:1/none" };
    const cases: [string[], string][] = [
      [["--state", "done"], "--state must be one of scheduled, blocked, ready, leased, lease_expired"],
      [["--limit", "0"], "--limit must be a whole number from 1 to 1000"],
      [["--limit", "1001"], "--limit must be a whole number from 1 to 1000"],
      [["--limit", "2x"], "--limit must be a whole number from 1 to 1000"],
      [["--frob"], 'unknown option "--frob"'],
      [["extra"], 'unexpected argument "extra"'],
    ];
    const results = await Promise.all(cases.map(([args]) => cli(["peek", ...args], unreachable)));
    results.forEach((out, i) => {
      expect(out.code).toBe(2);
      expect(out.stderr).toContain(cases[i]?.[1]);
      expect(out.stderr).toContain("Usage: outbox-worker peek");
      expect(out.stderr).not.toContain("ECONNREFUSED");
    });
  });

  it("changes nothing: row versions (xmin), counters and leases are the same after peek, status and list", async () => {
    const before = await snapshot(s.schema);
    expect(before.messages).toHaveLength(5);
    for (const args of [["peek"], ["peek", "--json"], ["status"], ["dead-letters", "list"]]) {
      expect((await cli([...args, "--schema", s.schema])).code).toBe(0);
    }
    expect(await snapshot(s.schema)).toEqual(before);
  });

  it("is not blocked by rows another transaction holds FOR UPDATE", async () => {
    const { messages } = outboxNames(s.schema);
    const holder = await db.pool.connect();
    const other = new pg.Client({ connectionString: db.url });
    await other.connect();
    try {
      await holder.query("BEGIN");
      await holder.query(`SELECT id FROM ${messages} FOR UPDATE`);
      // The control: anything that wants a row lock now gives up after lock_timeout.
      await other.query("SET lock_timeout = '200ms'");
      await expect(
        other.query(`SELECT id FROM ${messages} WHERE id = $1 FOR UPDATE`, [s.m.r1]),
      ).rejects.toMatchObject({ code: "55P03" });
      // peek under the same lock_timeout sees every row, the locked ones included (so no SKIP LOCKED either).
      const viaLibrary = await peekMessages(other, s.schema);
      expect(viaLibrary.map((r) => r.id)).toEqual([s.m.r1, s.m.e1, s.m.r2, s.m.l1, s.m.s1]);
      // A peek that waited for a row lock would fail with 55P03 after lock_timeout, not exit 0.
      const out = await cli(["peek", "--json", "--schema", s.schema], { PGOPTIONS: "-c lock_timeout=200" });
      expect(out.stderr).toBe("");
      expect(out.code).toBe(0);
      expect((JSON.parse(out.stdout) as { id: string }[]).map((r) => r.id)).toEqual([
        s.m.r1,
        s.m.e1,
        s.m.r2,
        s.m.l1,
        s.m.s1,
      ]);
      const status = await cli(["status", "--schema", s.schema], { PGOPTIONS: "-c lock_timeout=200" });
      expect(status.code).toBe(0);
    } finally {
      await holder.query("ROLLBACK").catch(() => {});
      holder.release();
      await other.end();
    }
  });
});

describe("outbox-worker dead-letters list and show", () => {
  let s: Seeded;
  beforeAll(async () => {
    s = await seeded("dl");
  });

  it("lists dead letters newest first, in aligned columns, cutting errors and payloads", async () => {
    const out = await cli(["dead-letters", "list", "--schema", s.schema]);
    expect(out.stderr).toBe("");
    expect(out.code).toBe(0);
    const [header = "", ...rows] = lines(out.stdout);
    expect(header).toMatch(
      /^ID\s+QUEUE\s+KEY\s+REASON\s+DEAD FOR\s+DELIVERIES\s+ATTEMPTS\s+ERROR\s+PAYLOAD$/,
    );
    const at = (name: string) => header.indexOf(name);
    const expected = [
      [s.d.d4, "mail", "max_deliveries", "\\d\\d s"],
      [s.d.d3, "mail", "rejected", "1 h"],
      [s.d.d2, "orders", "rejected", "3 d"],
      [s.d.d1, "orders", "retries_exhausted", "10 d"],
    ];
    expect(rows).toHaveLength(4);
    rows.forEach((row, i) => {
      const [id, queue, reason, age] = expected[i] ?? [];
      expect(row.slice(0, at("QUEUE")).trim()).toBe(id);
      expect(row.slice(at("QUEUE")).startsWith(`${queue} `)).toBe(true);
      expect(row.slice(at("REASON")).startsWith(`${reason} `)).toBe(true);
      // Right-aligned: the age ends where the header does.
      expect(row.slice(0, at("DEAD FOR") + "DEAD FOR".length)).toMatch(new RegExp(` ${age}$`));
    });
    expect(rows[1]?.slice(at("ERROR"))).toMatch(/^boom\\n {4}at handler/);
    expect(rows[1]).not.toContain("worker.ts");
    expect(rows[1]?.slice(at("PAYLOAD"))).toHaveLength(60);
    expect(rows[0]?.slice(at("ERROR")).startsWith("- ")).toBe(true);
  });

  it("filters by --queue, --reason and --limit; --json prints whole rows", async () => {
    const pick = async (...args: string[]) =>
      (
        JSON.parse((await cli(["dead-letters", "list", "--schema", s.schema, "--json", ...args])).stdout) as {
          id: string;
        }[]
      ).map((r) => r.id);
    expect(await pick("--queue", "mail")).toEqual([s.d.d4, s.d.d3]);
    expect(await pick("--reason", "rejected")).toEqual([s.d.d3, s.d.d2]);
    expect(await pick("--reason", "rejected", "--queue", "orders")).toEqual([s.d.d2]);
    expect(await pick("--limit", "1")).toEqual([s.d.d4]);

    const out = await cli(["dead-letters", "list", "--schema", s.schema, "--json", "--queue", "mail"]);
    const [, d3] = JSON.parse(out.stdout) as Record<string, unknown>[];
    expect(d3).toMatchObject({
      id: s.d.d3,
      queue: "mail",
      key: "k-9",
      reason: "rejected",
      error: ERROR_TRACE,
      payload: BIG_PAYLOAD,
      deliveries_count: 5,
      attempts_count: 4,
      failures_count: 3,
      acquired_by: "worker-z",
    });
    expect(d3?.dead_age_s).toBeGreaterThanOrEqual(3600);
    expect(d3?.dead_age_s).toBeLessThan(3700);
    expect((await cli(["dead-letters", "list", "--schema", s.schema, "--queue", "none"])).stdout).toBe(
      "no dead letters\n",
    );
  });

  it("show prints one dead letter with its full error, headers and payload", async () => {
    const out = await cli(["dead-letters", "show", s.d.d3, "--schema", s.schema]);
    expect(out.stderr).toBe("");
    expect(out.code).toBe(0);
    expect(out.stdout).toContain(`id:            ${s.d.d3}\n`);
    expect(out.stdout).toContain("reason:        rejected\n");
    expect(out.stdout).toMatch(/dead at: {7}\d{4}-\d\d-\d\dT[\d:.]+Z \(1 h ago\)/);
    expect(out.stdout).toContain("traceparent");
    expect(out.stdout).toContain(`error:\n${ERROR_TRACE.replace(/^/gm, "  ")}\n`);
    expect(out.stdout).toContain(`payload:\n${JSON.stringify(BIG_PAYLOAD, null, 2).replace(/^/gm, "  ")}\n`);

    const json = await cli(["dead-letters", "show", s.d.d3, "--json", "--schema", s.schema]);
    expect(JSON.parse(json.stdout)).toMatchObject({
      id: s.d.d3,
      headers: { traceparent: expect.stringMatching(/^00-/) },
      error: ERROR_TRACE,
      payload: BIG_PAYLOAD,
    });
  });

  it("show: exit 1 for an id that is not a dead letter, exit 2 for a malformed or missing id", async () => {
    const [missing, malformed, none] = await Promise.all([
      cli(["dead-letters", "show", s.m.r1, "--schema", s.schema]),
      cli(["dead-letters", "show", "12abc", "--schema", s.schema]),
      cli(["dead-letters", "show", "--schema", s.schema]),
    ]);
    expect(missing.code).toBe(1);
    expect(missing.stderr).toContain(`no dead letter with id ${s.m.r1}`);
    expect(malformed.code).toBe(2);
    expect(malformed.stderr).toContain('ID must be a message id (a positive whole number), got "12abc"');
    expect(none.code).toBe(2);
    expect(none.stderr).toContain("show needs the id of a dead letter");
    expect(none.stderr).toContain("Usage: outbox-worker dead-letters");
  });
});

describe("outbox-worker dead-letters replay", () => {
  async function deadRows(schema: string, wanted: string[]) {
    const { rows } = await db.pool.query(
      `SELECT * FROM ${outboxNames(schema).deadLetters} WHERE id = ANY($1::bigint[]) ORDER BY id`,
      [wanted],
    );
    return rows;
  }

  it("by id: same ids back in messages, counters reset, available now, gone from dead_letters, workers woken", async () => {
    const s = await seeded("rid");
    const names = outboxNames(s.schema);
    const before = await deadRows(s.schema, [s.d.d1, s.d.d3]);
    const listener = await listen(db.url, names.channel);
    try {
      const out = await cli(["dead-letters", "replay", "--id", s.d.d1, "--id", s.d.d3, "--schema", s.schema]);
      expect(out.stderr).toBe("");
      expect(out.code).toBe(0);
      expect(out.stdout).toBe("replayed 2 dead letters (queue mail: 1, queue orders: 1)\n");
      expect([...(await listener.waitFor(2))].sort()).toEqual(["mail", "orders"]);
      expect(await listener.settle()).toHaveLength(2);
    } finally {
      await listener.close();
    }
    expect(await ids(names.deadLetters)).toEqual([s.d.d2, s.d.d4]);
    const { rows } = await db.pool.query(
      `SELECT m.*, extract(epoch FROM now() - m.available_at)::float8 AS waited_s
       FROM ${names.messages} AS m WHERE id = ANY($1::bigint[]) ORDER BY id`,
      [[s.d.d1, s.d.d3]],
    );
    expect(rows).toHaveLength(2);
    rows.forEach((row, i) => {
      const dead = before[i];
      expect(row).toMatchObject({
        id: dead.id,
        queue: dead.queue,
        payload: dead.payload,
        headers: dead.headers,
        key: dead.key,
        deliveries_count: 0,
        attempts_count: 0,
        failures_count: 0,
        acquired_at: null,
        acquired_token: null,
        acquired_by: null,
        lease_expires_at: null,
        first_attempt_at: null,
        last_attempt_at: null,
        last_error: dead.error,
      });
      expect(row.created_at.getTime()).toBe(dead.created_at.getTime());
      expect(row.waited_s).toBeGreaterThanOrEqual(0);
      expect(row.waited_s).toBeLessThan(30);
    });
    // The view agrees: both are ready for a worker now.
    const { rows: states } = await db.pool.query(
      `SELECT state FROM ${names.unprocessed} WHERE id = ANY($1::bigint[])`,
      [[s.d.d1, s.d.d3]],
    );
    expect(states.map((r) => r.state)).toEqual(["ready", "ready"]);
  });

  it("by queue, by reason and both: only matching rows move, one wake-up per queue", async () => {
    const s = await seeded("rq");
    const names = outboxNames(s.schema);
    const listener = await listen(db.url, names.channel);
    try {
      const byQueue = await cli(["dead-letters", "replay", "--queue", "mail", "--schema", s.schema]);
      expect(byQueue.code).toBe(0);
      expect(byQueue.stdout).toBe("replayed 2 dead letters (queue mail: 2)\n");
      await listener.waitFor(1);
      expect(await listener.settle()).toEqual(["mail"]);
      expect(await ids(names.deadLetters)).toEqual([s.d.d1, s.d.d2]);

      const byReason = await cli(["dead-letters", "replay", "--reason", "rejected", "--schema", s.schema]);
      expect(byReason.stdout).toBe("replayed 1 dead letter (queue orders: 1)\n");
      await listener.waitFor(2);
      expect(await ids(names.deadLetters)).toEqual([s.d.d1]);

      const neither = await cli(["dead-letters", "replay", "--reason", "rejected", "--queue", "orders"], {
        OUTBOX_SCHEMA: s.schema,
      });
      expect(neither.stdout).toBe("replayed 0 dead letters\n");
      expect(await listener.settle()).toEqual(["mail", "orders"]);
    } finally {
      await listener.close();
    }
    expect(await ids(names.messages)).toEqual(expect.arrayContaining([s.d.d2, s.d.d3, s.d.d4]));
  });

  it("refuses to replay without a filter, and --all with a filter; --all and comma-separated ids work", async () => {
    const s = await seeded("rall");
    const names = outboxNames(s.schema);
    const before = await snapshot(s.schema);
    const [bare, mixed, badId] = await Promise.all([
      cli(["dead-letters", "replay", "--schema", s.schema]),
      cli(["dead-letters", "replay", "--all", "--queue", "mail", "--schema", s.schema]),
      cli(["dead-letters", "replay", "--id", `${s.d.d1},-3`, "--schema", s.schema]),
    ]);
    expect(bare.code).toBe(2);
    expect(bare.stderr).toContain("refusing to replay without a filter");
    expect(bare.stderr).toContain("--all");
    expect(bare.stderr).toContain("Usage: outbox-worker dead-letters");
    expect(mixed.code).toBe(2);
    expect(mixed.stderr).toContain("--all cannot be combined with --id, --queue or --reason");
    expect(badId.code).toBe(2);
    expect(badId.stderr).toContain('--id must be a message id (a positive whole number), got "-3"');
    expect(await snapshot(s.schema)).toEqual(before);

    const some = await cli(["dead-letters", "replay", "--id", `${s.d.d2},${s.d.d4}`, "--schema", s.schema]);
    expect(some.stdout).toBe("replayed 2 dead letters (queue mail: 1, queue orders: 1)\n");
    const all = await cli(["dead-letters", "replay", "--all", "--schema", s.schema]);
    expect(all.stdout).toBe("replayed 2 dead letters (queue mail: 1, queue orders: 1)\n");
    expect(await ids(names.deadLetters)).toEqual([]);
    expect(await ids(names.messages)).toEqual(expect.arrayContaining(Object.values(s.d)));
  });

  it("--dry-run prints what it would do and changes nothing, and sends no wake-up", async () => {
    const s = await seeded("rdry");
    const before = await snapshot(s.schema);
    const listener = await listen(db.url, outboxNames(s.schema).channel);
    try {
      const out = await cli(["dead-letters", "replay", "--all", "--dry-run", "--schema", s.schema]);
      expect(out.code).toBe(0);
      expect(out.stdout).toBe(
        "dry run: would replay 4 dead letters (queue mail: 2, queue orders: 2); nothing changed\n",
      );
      const one = await cli(["dead-letters", "replay", "--reason", "max_deliveries", "--dry-run"], {
        OUTBOX_SCHEMA: s.schema,
      });
      expect(one.stdout).toBe("dry run: would replay 1 dead letter (queue mail: 1); nothing changed\n");
      expect(await listener.settle()).toEqual([]);
    } finally {
      await listener.close();
    }
    expect(await snapshot(s.schema)).toEqual(before);
  });

  it("leaves a dead letter whose id is already a message where it is, and says so with exit 1", async () => {
    const s = await seeded("rdup");
    const names = outboxNames(s.schema);
    await db.pool.query(
      `INSERT INTO ${names.messages} (id, queue, payload) OVERRIDING SYSTEM VALUE VALUES ($1, 'orders', '{"live":true}')`,
      [s.d.d2],
    );
    const dry = await cli(["dead-letters", "replay", "--queue", "orders", "--dry-run", "--schema", s.schema]);
    expect(dry.stdout).toBe(
      "dry run: would replay 1 dead letter (queue orders: 1); nothing changed\n" +
        `would skip 1 dead letter whose id is already in the outbox (left in dead_letters): ${s.d.d2}\n`,
    );
    const out = await cli(["dead-letters", "replay", "--queue", "orders", "--schema", s.schema]);
    expect(out.code).toBe(1);
    expect(out.stdout).toBe("replayed 1 dead letter (queue orders: 1)\n");
    expect(out.stderr).toContain(
      `skipped 1 dead letter whose id is already in the outbox (left in dead_letters): ${s.d.d2}`,
    );
    // Nothing lost: the dead letter is still there, the live message untouched, the other one moved.
    expect(await ids(names.deadLetters)).toEqual([s.d.d2, s.d.d3, s.d.d4]);
    const { rows } = await db.pool.query(
      `SELECT id, payload FROM ${names.messages} WHERE id = ANY($1::bigint[])`,
      [[s.d.d1, s.d.d2]],
    );
    expect(rows.sort((a, b) => Number(a.id) - Number(b.id))).toEqual([
      { id: s.d.d1, payload: { n: "d1" } },
      { id: s.d.d2, payload: { live: true } },
    ]);
  });
});

describe("outbox-worker dead-letters purge", () => {
  it("deletes only dead letters older than the duration; --dry-run only counts; --queue narrows", async () => {
    const s = await seeded("pg");
    const names = outboxNames(s.schema);
    const before = await snapshot(s.schema);
    const dry = await cli(["dead-letters", "purge", "--older-than", "2d", "--dry-run", "--schema", s.schema]);
    expect(dry.code).toBe(0);
    expect(dry.stdout).toBe(
      "dry run: would purge 2 dead letters older than 2d (queue orders: 2); nothing changed\n",
    );
    expect(await snapshot(s.schema)).toEqual(before);

    const purged = await cli(["dead-letters", "purge", "--older-than", "4d", "--schema", s.schema]);
    expect(purged.stdout).toBe("purged 1 dead letter older than 4d (queue orders: 1)\n");
    expect(await ids(names.deadLetters)).toEqual([s.d.d2, s.d.d3, s.d.d4]);

    const mailOnly = await cli(["dead-letters", "purge", "--older-than", "1m", "--queue", "mail"], {
      OUTBOX_SCHEMA: s.schema,
    });
    expect(mailOnly.stdout).toBe("purged 1 dead letter older than 1m (queue mail: 1)\n");
    expect(await ids(names.deadLetters)).toEqual([s.d.d2, s.d.d4]);

    const rest = await cli(["dead-letters", "purge", "--older-than", "90s", "--schema", s.schema]);
    expect(rest.stdout).toBe("purged 1 dead letter older than 90s (queue orders: 1)\n");
    expect(await ids(names.deadLetters)).toEqual([s.d.d4]);
    expect(before.messages).toEqual((await snapshot(s.schema)).messages);
  });

  it("rejects malformed, zero, negative and unit-less durations with exit 2, naming --older-than", async () => {
    const bad = ["7 days", "7days", "-1d", "0d", "7", "1.5h", "7D", "d", "7dd", "", "1w", "07d"];
    const reason = (v: string) =>
      `--older-than must be a positive whole number followed by s, m, h or d (e.g. 30m, 12h, 7d), got ${JSON.stringify(v)}`;
    // The parser itself for every value; two of them through the CLI (a process each costs seconds on 2 cores).
    for (const v of bad) expect(() => parseDuration(v), v).toThrow(reason(v));
    expect(parseDuration("90s")).toBe(90_000);
    expect(parseDuration("7d")).toBe(7 * 86_400_000);
    const s = await seeded("pgbad");
    const before = await snapshot(s.schema);
    const results = await Promise.all(
      ["7 days", "0d"].map((v) => cli(["dead-letters", "purge", `--older-than=${v}`, "--schema", s.schema])),
    );
    for (const [i, out] of results.entries()) {
      expect(out.code).toBe(2);
      expect(out.stderr).toContain(reason(["7 days", "0d"][i] ?? ""));
      expect(out.stderr).toContain("Usage: outbox-worker dead-letters");
    }
    const missing = await cli(["dead-letters", "purge", "--schema", s.schema]);
    expect(missing.code).toBe(2);
    expect(missing.stderr).toContain("purge needs --older-than");
    expect(await snapshot(s.schema)).toEqual(before);
  });
});

describe("inspection commands: help, usage errors and failures", () => {
  it("--help prints each command's usage with exit 0", async () => {
    const runs = await Promise.all([
      cli(["status", "--help"]),
      cli(["peek", "-h"]),
      cli(["dead-letters", "--help"]),
      cli(["dead-letters", "replay", "--help"]),
    ]);
    const [status, peek, dead, replay] = runs;
    for (const out of runs) expect(out.code).toBe(0);
    expect(status?.stdout).toContain(
      "Usage: outbox-worker status [--schema NAME] [--database-url URL] [--json]",
    );
    expect(peek?.stdout).toContain(
      "Usage: outbox-worker peek [--queue Q] [--state STATE] [--limit N] [--json]",
    );
    expect(dead?.stdout).toContain("Usage: outbox-worker dead-letters list|show|replay|purge [options]");
    expect(replay?.stdout).toContain(
      "dead-letters replay (--id ID... | --queue Q | --reason R | --all) [--dry-run]",
    );
    expect((await cli(["--help"])).stdout).toMatch(/status .*\n.*peek .*\n.*dead-letters /);
  });

  it("bad flags, subcommands and arguments exit 2 with the usage line", async () => {
    const cases: [string[], string, string][] = [
      [["status", "--frob"], 'unknown option "--frob"', "Usage: outbox-worker status"],
      [["status", "now"], 'unexpected argument "now"', "Usage: outbox-worker status"],
      [["dead-letters"], 'expected list, show, replay or purge, got ""', "Usage: outbox-worker dead-letters"],
      [
        ["dead-letters", "frob"],
        'expected list, show, replay or purge, got "frob"',
        "Usage: outbox-worker dead-letters",
      ],
      [
        ["dead-letters", "list", "--dry-run"],
        'unknown option "--dry-run"',
        "Usage: outbox-worker dead-letters",
      ],
      [
        ["dead-letters", "list", "--limit", "5000"],
        "--limit must be a whole number",
        "Usage: outbox-worker dead-letters",
      ],
    ];
    const results = await Promise.all(cases.map(([args]) => cli(args)));
    results.forEach((out, i) => {
      const [, message, usage] = cases[i] ?? [];
      expect(out.code).toBe(2);
      expect(out.stderr).toContain(message);
      expect(out.stderr).toContain(usage);
    });
  });

  it("a hostile schema name exits 2 before connecting", async () => {
    const env = { DATABASE_URL: "postgres://u:canary-pw@127.0.0.1:1/none" };
    const hostile = 'x"; drop table t;--';
    const results = await Promise.all([
      cli(["status", "--schema", hostile], env),
      cli(["peek", "--schema", hostile], env),
      cli(["dead-letters", "replay", "--all", "--schema", hostile], env),
    ]);
    for (const out of results) {
      expect(out.code).toBe(2);
      expect(out.stderr).toContain("invalid schema");
      expect(out.stderr).not.toContain("ECONNREFUSED");
    }
  });

  it("an unreachable database exits 1 with the password redacted", async () => {
    const env = {
      DATABASE_URL: "postgres://app:canary-pw2@127.0.0.1:1/none?password=canary-pw2",
      PGPASSWORD: "canary-pw3",
    };
    const results = await Promise.all([
      cli(["status"], env),
      cli(["peek", "--state", "ready"], env),
      cli(["dead-letters", "list"], env),
      cli(["dead-letters", "purge", "--older-than", "7d"], env),
    ]);
    for (const out of results) {
      expect(out.code).toBe(1);
      expect(out.stderr).toMatch(/ECONNREFUSED/);
      expect(out.stdout + out.stderr).not.toMatch(/canary-pw/);
    }
  });
});
