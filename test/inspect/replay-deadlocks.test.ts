import pg from "pg";
import { beforeAll, describe, expect, it } from "vitest";
import { replayDeadLetters } from "../../src/inspect/dead-letters.js";
import type { PgQueryable } from "../../src/sql/executor.js";
import { testDatabase } from "../support/database.js";
import { workerFactory } from "../support/worker.js";

/**
 * Issue 41.6 (DESIGN §4.18): replay never takes part in a deadlock with a producer. A plain-SQL producer's
 * multi-row `INSERT … SELECT` takes its keys' locks in its own row order (the key-head trigger), whatever
 * order the package uses; replay-all brings back dead letters of the same keys meanwhile. A deadlock aborts
 * one side with 40P01 (the server log's `deadlock detected`): every side's errors are collected, and none
 * may be one. Each producer has keys of its own, so producers never deadlock each other: any deadlock here
 * has replay in it.
 */
const db = testDatabase("rpdl");
const workers = workerFactory(db);

const QUEUE = "rd";
/** Events kept for want of a subscriber (reason no_subscribers) of this topic, which QUEUE subscribes now. */
const TOPIC = "rd.kept";

beforeAll(async () => {
  await db.migrate();
  await db.pool.query(`INSERT INTO ${db.names.subscriptions} (pattern, queue) VALUES ($1, $2)`, [
    TOPIC,
    QUEUE,
  ]);
});

const PRODUCERS = 4;
const KEYS_EACH = 8;
const STATEMENTS = 100;

async function count(table: string): Promise<number> {
  return (await db.pool.query(`SELECT count(*)::int AS n FROM ${table}`)).rows[0].n;
}

const isDeadlock = (error: unknown) => (error as { code?: string } | null)?.code === "40P01";

function shuffled<T>(xs: T[]): T[] {
  const out = [...xs];
  for (let i = out.length - 1; i > 0; i--) {
    const j = Math.floor(Math.random() * (i + 1));
    [out[i], out[j]] = [out[j] as T, out[i] as T];
  }
  return out;
}

const keysOf = (p: number) => Array.from({ length: KEYS_EACH }, (_, k) => `p${p}-k${k}`);
const allKeys = Array.from({ length: PRODUCERS }, (_, p) => keysOf(p)).flat();

describe("replay and plain-SQL producers", () => {
  it("never deadlock: replay-all tries its keys' locks and leaves a key a producer holds for a later round", {
    timeout: 180_000,
  }, async () => {
    const errors: unknown[] = [];
    const produced: string[] = [];
    const dead: string[] = [];
    const kept: string[] = [];
    let replayed = 0;
    let skipped = 0;
    // Replay's tries that found a key busy (a producer held it) and left it for the next: the race happened.
    let busyTries = 0;
    const watched: PgQueryable = {
      async query(config) {
        const answer = await db.pool.query(config);
        if (answer.rows.some((r: { busy_ids?: string[] }) => (r.busy_ids?.length ?? 0) > 0)) busyTries++;
        return answer;
      },
    };

    // Dead letters on half the keys each round (a message of QUEUE, and a kept event of TOPIC that replay
    // fans out to QUEUE), so that every replay wants keys of every producer.
    const bury = async (round: number) => {
      const { rows } = await db.pool.query<{ id: string; kept: boolean }>(
        `WITH picked AS (
           SELECT nextval(pg_get_serial_sequence('${db.names.messages}', 'id')) AS id, k, kept
           FROM unnest($3::text[]) AS k CROSS JOIN (VALUES (false), (true)) AS v(kept)
         )
         INSERT INTO ${db.names.deadLetters}
           (id, queue, payload, headers, key, created_at, available_at, deliveries_count, attempts_count, reason, error)
         SELECT id, CASE WHEN kept THEN $4 ELSE $1 END, jsonb_build_object('dead', $2::int, 'from', id::text),
                CASE WHEN kept THEN jsonb_build_object('outbox-topic', $4::text) ELSE '{}' END, k, now(), now(), 1, 1,
                CASE WHEN kept THEN 'no_subscribers' ELSE 'rejected' END, 'refused'
         FROM picked
         RETURNING id::text AS id, reason = 'no_subscribers' AS kept`,
        [QUEUE, round, shuffled(allKeys).slice(0, allKeys.length / 2), TOPIC],
      );
      for (const r of rows) (r.kept ? kept : dead).push(r.id);
    };

    let producing = true;
    const producers = Promise.all(
      Array.from({ length: PRODUCERS }, async (_, p) => {
        const client = new pg.Client({ connectionString: db.url });
        await client.connect();
        try {
          for (let s = 0; s < STATEMENTS; s++) {
            // Every key of this producer, in a new random order each time: the trigger locks them in it, one
            // row at a time (a millisecond apart, as an INSERT … SELECT over a slower query would).
            try {
              await client.query("BEGIN");
              const { rows } = await client.query<{ id: string }>(
                `INSERT INTO ${db.names.messages} (queue, payload, key)
                 SELECT $1, jsonb_build_object('p', $2::int, 's', $3::int), t.key
                 FROM unnest($4::text[]) AS t(key)
                 WHERE pg_sleep(0.001)::text = ''
                 RETURNING id::text AS id`,
                [QUEUE, p, s, shuffled(keysOf(p))],
              );
              await client.query("COMMIT");
              produced.push(...rows.map((r) => r.id));
            } catch (error) {
              errors.push(error);
              await client.query("ROLLBACK").catch(() => {});
            }
          }
        } finally {
          await client.end();
        }
      }),
    ).finally(() => {
      producing = false;
    });

    const replayer = (async () => {
      let round = 0;
      while (producing) {
        await bury(round++);
        try {
          const result = await replayDeadLetters(watched, db.schema, { all: true });
          replayed += result.replayed;
          skipped += result.skipped;
        } catch (error) {
          errors.push(error);
        }
      }
    })();

    await Promise.all([producers, replayer]);
    // Whatever the race left (a round that ended with producers still holding keys) comes back now.
    const last = await replayDeadLetters(db.pool, db.schema, { all: true });
    replayed += last.replayed;
    skipped += last.skipped;

    const deadlocks = errors.filter(isDeadlock);
    expect(deadlocks, "deadlock detected (40P01)").toEqual([]);
    expect(errors).toEqual([]);
    expect(busyTries, "replay found no key busy: the race did not happen").toBeGreaterThan(0);
    expect(produced).toHaveLength(PRODUCERS * STATEMENTS * KEYS_EACH);
    expect(dead.length).toBeGreaterThan(0);

    // Every produced row and every replayed dead letter is in messages, once (a kept event as its copy for
    // QUEUE, a new id); no dead letter is left.
    expect(replayed).toBe(dead.length + kept.length);
    expect(skipped).toBe(0);
    const { rows: left } = await db.pool.query(`SELECT id FROM ${db.names.deadLetters}`);
    expect(left).toEqual([]);
    const { rows: messages } = await db.pool.query<{
      id: string;
      key: string;
      head: boolean;
      from: string | null;
      copy: boolean;
    }>(
      `SELECT id::text AS id, key, head, payload ->> 'from' AS from, headers ? 'outbox-topic' AS copy
       FROM ${db.names.messages} ORDER BY id`,
    );
    expect(
      messages
        .filter((m) => !m.copy)
        .map((m) => m.id)
        .sort(),
    ).toEqual([...produced, ...dead].sort());
    expect(
      messages
        .filter((m) => m.copy)
        .map((m) => m.from)
        .sort(),
    ).toEqual([...kept].sort());

    // Per-key order as docs/guide/ordering.md promises: one head per key, delivered first; a replayed dead
    // letter (an older id) comes back to the front of the rest of its key's line, so after the head each
    // key's messages run one at a time in id order.
    const byKey = new Map<string, { ids: bigint[]; heads: bigint[] }>();
    for (const m of messages) {
      const k = byKey.get(m.key) ?? { ids: [], heads: [] };
      byKey.set(m.key, k);
      k.ids.push(BigInt(m.id));
      if (m.head) k.heads.push(BigInt(m.id));
    }
    for (const [key, k] of byKey) expect(k.heads, `heads of ${key}`).toHaveLength(1);

    const runs = new Map<string, bigint[]>();
    let overlapped = false;
    const inFlight = new Set<string>();
    await workers.start({
      concurrency: 8,
      queues: {
        [QUEUE]: async (_p, m) => {
          const key = m.key as string;
          if (inFlight.has(key)) overlapped = true;
          inFlight.add(key);
          await new Promise((resolve) => setImmediate(resolve));
          runs.set(key, [...(runs.get(key) ?? []), BigInt(m.id)]);
          inFlight.delete(key);
        },
      },
    });
    await expect.poll(() => count(db.names.messages), { timeout: 120_000 }).toBe(0);
    expect(overlapped, "two messages of one key ran at once").toBe(false);
    for (const [key, k] of byKey) {
      const head = k.heads[0] as bigint;
      const rest = k.ids.filter((id) => id !== head).sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
      expect(runs.get(key), `delivery order of ${key}`).toEqual([head, ...rest]);
    }
  });

  it("a key a producer holds is left for a later try, not waited for: the other keys move at once, it moves when the producer commits, and past busyTimeoutMs it stays a dead letter, reported busy", async () => {
    const queue = "rb";
    const topic = "rb.kept";
    await db.pool.query(`INSERT INTO ${db.names.subscriptions} (pattern, queue) VALUES ($1, $2)`, [
      topic,
      queue,
    ]);
    // A message and a kept event (fanned out to `queue`) on each of keys a, b, c.
    const bury = async () =>
      (
        await db.pool.query<{ id: string; key: string }>(
          `INSERT INTO ${db.names.deadLetters}
             (id, queue, payload, headers, key, created_at, available_at, deliveries_count, attempts_count, reason)
           SELECT nextval(pg_get_serial_sequence('${db.names.messages}', 'id')), CASE WHEN kept THEN $2 ELSE $1 END, '{}',
                  CASE WHEN kept THEN jsonb_build_object('outbox-topic', $2::text) ELSE '{}' END, k, now(), now(), 1, 1,
                  CASE WHEN kept THEN 'no_subscribers' ELSE 'rejected' END
           FROM unnest(ARRAY['a', 'b', 'c']) AS k CROSS JOIN (VALUES (false), (true)) AS v(kept)
           RETURNING id::text AS id, key`,
          [queue, topic],
        )
      ).rows;
    const deadOn = async (key: string) =>
      (await db.pool.query(`SELECT id FROM ${db.names.deadLetters} WHERE key = $1`, [key])).rowCount;

    // A producer's transaction writing key b, left open: it holds b's lock.
    const producer = new pg.Client({ connectionString: db.url });
    await producer.connect();
    try {
      await bury();
      await producer.query("BEGIN");
      await producer.query(`INSERT INTO ${db.names.messages} (queue, payload, key) VALUES ($1, '{}', 'b')`, [
        queue,
      ]);
      const replay = replayDeadLetters(db.pool, db.schema, { all: true });
      // a and c came back while b's producer is still open: nothing of the replay waited for it.
      await expect
        .poll(async () => [await deadOn("a"), await deadOn("b"), await deadOn("c")])
        .toEqual([0, 2, 0]);
      await producer.query("COMMIT");
      const result = await replay;
      expect(result).toMatchObject({ replayed: 6, skipped: 0, busy: 0 });
      expect(await deadOn("b")).toBe(0);

      // Held past busyTimeoutMs (0: one try): b stays a dead letter, reported with its ids.
      const again = await bury();
      await producer.query("BEGIN");
      await producer.query(`INSERT INTO ${db.names.messages} (queue, payload, key) VALUES ($1, '{}', 'b')`, [
        queue,
      ]);
      const timedOut = await replayDeadLetters(db.pool, db.schema, { all: true }, { busyTimeoutMs: 0 });
      await producer.query("COMMIT");
      const heldIds = again.filter((d) => d.key === "b").map((d) => d.id);
      expect(timedOut).toMatchObject({ replayed: 4, skipped: 0, busy: 2 });
      expect(timedOut.queues.flatMap((q) => q.busyIds).sort()).toEqual(heldIds.sort());
      expect(await deadOn("b")).toBe(2);
    } finally {
      await producer.end();
    }
  });
});
