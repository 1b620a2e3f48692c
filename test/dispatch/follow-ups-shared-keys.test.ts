import { beforeAll, describe, expect, it } from "vitest";
import { followUp } from "../../src/index.js";
import { testDatabase } from "../support/database.js";
import { publisherFor, until, workerFactory } from "../support/worker.js";

/**
 * Two workers ack parents whose follow-ups share a few keys (their acks take turns on those keys) while
 * producers publish into the same keys one `publish` at a time, in any order within their transactions
 * (the order that deadlocks a writer that waits for one key while holding another). Nothing may deadlock
 * or fail, every follow-up lands once, and each key's messages run one at a time in id order.
 */
const db = testDatabase("fushared");
const workers = workerFactory(db);
const outbox = publisherFor(db.schema);

beforeAll(() => db.migrate());

const KEYS = 6;
const PARENTS = 600;
const PRODUCER_TXS = 150;

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

describe("follow-ups on keys shared by two workers and producers", () => {
  it("no deadlock, no failure, each follow-up once, each key in id order", { timeout: 180_000 }, async () => {
    // Half the parents keyed (the keyed ack), half keyless; each publishes into two of the shared keys.
    await db.inTransaction((c) =>
      outbox.publishMany(
        c,
        "sk.parent",
        Array.from({ length: PARENTS }, (_, n) => ({ payload: { n }, ...(n % 2 ? { key: `p${n}` } : {}) })),
      ),
    );
    const errors: unknown[] = [];
    const running = new Map<string, number>();
    const order = new Map<string, bigint[]>();
    let overlap = 0;
    const child = async (_p: unknown, m: { id: string; key: string | null }) => {
      const k = m.key ?? "";
      if ((running.get(k) ?? 0) > 0) overlap++;
      running.set(k, (running.get(k) ?? 0) + 1);
      order.set(k, [...(order.get(k) ?? []), BigInt(m.id)]);
      await sleep(1);
      running.set(k, (running.get(k) ?? 1) - 1);
    };
    const fleet = await Promise.all(
      [0, 1].map(() =>
        workers.start({
          concurrency: 8,
          queues: {
            "sk.parent": (payload: unknown) => {
              const { n } = payload as { n: number };
              const a = n % KEYS;
              const b = (n * 5 + 1) % KEYS === a ? (a + 1) % KEYS : (n * 5 + 1) % KEYS;
              return [
                followUp("sk.child", { n, k: b }, { key: `k${b}` }),
                followUp("sk.child", { n, k: a }, { key: `k${a}` }),
              ];
            },
            "sk.child": child,
          },
        }),
      ),
    );
    for (const w of fleet) {
      w.on("loop_error", (e) => errors.push(e.error));
      w.on("fatal", (e) => errors.push(e.error));
    }
    // Producers hold one shared key while they take another, in either order.
    await Promise.all(
      [0, 1, 2].map(async (p) => {
        for (let t = p; t < PRODUCER_TXS; t += 3) {
          const first = `k${t % KEYS}`;
          const second = `k${(t * 7 + 3) % KEYS === t % KEYS ? (t + 1) % KEYS : (t * 7 + 3) % KEYS}`;
          try {
            await db.inTransaction(async (c) => {
              await outbox.publish(c, "sk.child", { producer: t }, { key: first });
              await sleep(3);
              await outbox.publish(c, "sk.child", { producer: t }, { key: second });
            });
          } catch (error) {
            errors.push(error);
          }
        }
      }),
    );
    const total = 2 * PARENTS + 2 * PRODUCER_TXS;
    const handled = () => [...order.values()].reduce((n, ids) => n + ids.length, 0);
    await until(
      async () => {
        const { rows } = await db.pool.query(`SELECT count(*)::int AS n FROM ${db.names.messages}`);
        return (rows[0].n === 0 && handled() === total) || errors.length > 0;
      },
      "every parent and follow-up handled",
      150_000,
    );
    expect(errors).toEqual([]);
    expect(handled()).toBe(total);
    expect(overlap).toBe(0);
    for (const ids of order.values()) expect(ids).toEqual([...ids].sort((x, y) => (x < y ? -1 : 1)));
  });
});
