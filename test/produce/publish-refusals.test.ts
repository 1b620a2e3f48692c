import type pg from "pg";
import { beforeAll, describe, expect, it } from "vitest";
import { OutboxConfigError, OutboxError, OutboxPayloadError } from "../../src/contract/errors.js";
import type { PublishOptions } from "../../src/contract/publish-options.js";
import type { QueueDefinition } from "../../src/contract/queue.js";
import { FollowUps } from "../../src/dispatch/follow-ups.js";
import { replayDeadLetters } from "../../src/inspect/dead-letters.js";
import { createPublisher } from "../../src/produce/publisher.js";
import { testDatabase } from "../support/database.js";

/**
 * Invariant 17: whatever Postgres or a relay's transport would refuse is refused by `publish`,
 * `publishMany` and follow-ups alike, before any statement is sent, as an OutboxError naming the field;
 * the producer's transaction stays usable and its business rows commit.
 */

const db = testDatabase("refuse");
const outbox = createPublisher({ schema: db.schema, notify: false });

beforeAll(async () => {
  await db.migrate();
  await db.pool.query(`CREATE TABLE "${db.schema}".orders (id int PRIMARY KEY)`);
});

interface Refusal {
  what: string;
  queue?: QueueDefinition | string;
  payload?: unknown;
  options?: PublishOptions;
  error: typeof OutboxPayloadError | typeof OutboxConfigError;
  field: string;
}

const YEAR_10000 = new Date("+010000-01-01T00:00:00Z");
const items = [{ name: "a" }, { name: "b" }, { name: "c\u0000d" }];

const refusals: Refusal[] = [
  { what: "a NUL in the key", options: { key: "k\u0000" }, error: OutboxPayloadError, field: "key" },
  {
    what: "a lone surrogate in the key",
    options: { key: "k\uD800" },
    error: OutboxPayloadError,
    field: "key",
  },
  {
    what: "a NUL in a payload string",
    payload: { items },
    error: OutboxPayloadError,
    field: "payload.items[2].name",
  },
  {
    what: "a lone surrogate in a payload string",
    payload: { text: "a\uDC00b" },
    error: OutboxPayloadError,
    field: "payload.text",
  },
  {
    what: "a lone surrogate in a payload key",
    payload: { nested: { "bad\uD83D": 1 } },
    error: OutboxPayloadError,
    field: 'payload.nested["bad\\ud83d"]',
  },
  {
    what: "NaN in the payload",
    payload: { total: Number.NaN },
    error: OutboxPayloadError,
    field: "payload.total",
  },
  {
    what: "Infinity in the payload",
    payload: { lines: [{ qty: 1 }, { qty: Number.POSITIVE_INFINITY }] },
    error: OutboxPayloadError,
    field: "payload.lines[1].qty",
  },
  {
    what: "a delay past the year 9999",
    options: { delayMs: 1e15 },
    error: OutboxPayloadError,
    field: "delayMs",
  },
  {
    what: "availableAt in the year 10000",
    options: { availableAt: YEAR_10000 },
    error: OutboxPayloadError,
    field: "availableAt",
  },
  {
    what: "availableAt before the year 1",
    options: { availableAt: new Date("-000001-06-01T00:00:00Z") },
    error: OutboxPayloadError,
    field: "availableAt",
  },
  {
    what: "CR LF in a header name",
    options: { headers: { "x-a\r\nb": "1" } },
    error: OutboxPayloadError,
    field: 'headers["x-a\\r\\nb"]',
  },
  {
    what: "a header name that is not a token",
    options: { headers: { "x tenant": "1" } },
    error: OutboxPayloadError,
    field: 'headers["x tenant"]',
  },
  {
    what: "an empty header name",
    options: { headers: { "": "1" } },
    error: OutboxPayloadError,
    field: 'headers[""]',
  },
  {
    what: "a header name over 255 bytes",
    options: { headers: { ["x".repeat(256)]: "1" } },
    error: OutboxPayloadError,
    field: `headers.${"x".repeat(256)}`,
  },
  {
    what: "a line feed in a header value",
    options: { headers: { "x-a": "1\nx-b: 2" } },
    error: OutboxPayloadError,
    field: 'headers["x-a"]',
  },
  {
    what: "a NUL in a header value",
    options: { headers: { tenant: "a\u0000" } },
    error: OutboxPayloadError,
    field: "headers.tenant",
  },
  {
    what: "a lone surrogate in a header value",
    options: { headers: { tenant: "\uDFFF" } },
    error: OutboxPayloadError,
    field: "headers.tenant",
  },
  {
    what: "a hand-built queue definition whose name holds a NUL",
    queue: { name: "q\u0000", schema: undefined },
    error: OutboxConfigError,
    field: "queue",
  },
];

/**
 * In a transaction that first writes a business row: the attempt's error, and how many statements it sent
 * through the caller's connection. Then the transaction must still take a query, and it commits.
 */
async function inBusinessTransaction(
  orderId: number,
  attempt: (trx: pg.PoolClient) => Promise<unknown>,
): Promise<{ error: unknown; sent: number }> {
  return db.inTransaction(async (client) => {
    await client.query(`INSERT INTO "${db.schema}".orders VALUES ($1)`, [orderId]);
    let sent = 0;
    const counting = new Proxy(client, {
      get(target, property, receiver) {
        if (property !== "query") return Reflect.get(target, property, receiver);
        return (...args: unknown[]) => {
          sent++;
          return (target.query as (...a: unknown[]) => unknown)(...args);
        };
      },
    });
    const error = await attempt(counting).then(
      () => undefined,
      (e: unknown) => e,
    );
    // Still usable: after a failed statement this query would fail too (25P02, transaction aborted).
    expect((await client.query("SELECT 1 AS ok")).rows).toEqual([{ ok: 1 }]);
    return { error, sent };
  });
}

async function committed(orderId: number): Promise<boolean> {
  const { rows } = await db.pool.query(`SELECT 1 FROM "${db.schema}".orders WHERE id = $1`, [orderId]);
  return rows.length === 1;
}

function expectRefusal(error: unknown, refusal: Refusal, index?: number): void {
  expect(error).toBeInstanceOf(refusal.error);
  expect(error).toBeInstanceOf(OutboxError);
  expect((error as { field?: string }).field).toBe(refusal.field);
  if (index !== undefined) {
    expect((error as OutboxPayloadError).index).toBe(index);
    expect((error as Error).message).toContain(`item ${index}:`);
  }
}

let nextOrder = 1;

describe("refusals happen before anything is sent, naming the field, and the caller's transaction stays usable", () => {
  for (const refusal of refusals) {
    const queue = refusal.queue ?? "refused";
    const payload = refusal.payload ?? {};

    it(`publish refuses ${refusal.what}`, async () => {
      const order = nextOrder++;
      const { error, sent } = await inBusinessTransaction(order, (trx) =>
        outbox.publish(trx, queue, payload, refusal.options),
      );
      expectRefusal(error, refusal);
      expect(sent).toBe(0);
      expect(await committed(order)).toBe(true);
    });

    it(`publishMany refuses ${refusal.what}, naming the item`, async () => {
      const order = nextOrder++;
      const { error, sent } = await inBusinessTransaction(order, (trx) =>
        outbox.publishMany(trx, queue, [{ payload: {} }, { payload, ...refusal.options }]),
      );
      // A bad queue is the whole batch's, not one item's.
      expectRefusal(error, refusal, refusal.error === OutboxPayloadError ? 1 : undefined);
      expect(sent).toBe(0);
      expect(await committed(order)).toBe(true);
    });

    it(`a follow-up refuses ${refusal.what} as publish does`, () => {
      let error: unknown;
      try {
        new FollowUps().add(queue, payload, refusal.options);
      } catch (e) {
        error = e;
      }
      expectRefusal(error, refusal);
    });
  }
});

describe("what every transport and Postgres can carry is still accepted", () => {
  it("paired surrogates, escaped-looking text, nulls, a past availableAt and token header names", async () => {
    const order = nextOrder++;
    const payload = {
      emoji: "😀",
      text: "\\u0000 is six characters",
      none: null,
      nested: { "😀": [null, 1.5] },
    };
    const options: PublishOptions = {
      key: "k-😀",
      headers: { "x-tenant": "café 😀", "X-Trace_Id.1": "a\tb" },
      availableAt: new Date("2000-01-01T00:00:00Z"),
    };
    const id = await db.inTransaction(async (client) => {
      await client.query(`INSERT INTO "${db.schema}".orders VALUES ($1)`, [order]);
      return outbox.publish(client, "accepted", payload, options);
    });
    const { rows } = await db.pool.query(
      `SELECT payload, key, headers FROM ${db.names.messages} WHERE id = $1`,
      [id],
    );
    expect(rows[0]).toEqual({ payload, key: options.key, headers: options.headers });
    expect(() => new FollowUps().add("accepted", payload, options)).not.toThrow();
  });
});

describe("replay takes stored rows as they are, and refuses a filter Postgres cannot take before sending it", () => {
  for (const [field, filter] of [
    ["queue", { queue: "q\u0000" }],
    ["reason", { reason: "rejected\u0000" }],
  ] as const) {
    it(`a NUL in the ${field} filter is an OutboxConfigError naming it; the caller's transaction stays usable`, async () => {
      const order = nextOrder++;
      const { error, sent } = await inBusinessTransaction(order, (trx) =>
        replayDeadLetters(trx, db.schema, filter),
      );
      expect(error).toBeInstanceOf(OutboxConfigError);
      expect((error as OutboxConfigError).field).toBe(field);
      expect(sent).toBe(0);
      expect(await committed(order)).toBe(true);
    });
  }
});
