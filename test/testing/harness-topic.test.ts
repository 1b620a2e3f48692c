import { describe, expect, it } from "vitest";
import { z } from "zod";
import { OutboxPayloadError } from "../../src/contract/errors.js";
import type { MessageContext } from "../../src/contract/handler.js";
import { PermanentError, TransientError } from "../../src/contract/handler-errors.js";
import { defineQueue } from "../../src/produce/queue.js";
import { defineTopic, subscriberQueue } from "../../src/produce/topic.js";
import { constant } from "../../src/retry/strategies.js";
import { createManualClock, testTopic } from "../../src/testing/index.js";
import { handle } from "../../src/worker/options.js";

// One topic event through several subscribers' handlers, without a database: each copy decided on its own.

const orderPlaced = defineTopic(
  "order.placed",
  z.object({ orderId: z.string(), total: z.number(), currency: z.string().default("EUR") }),
);
const billing = subscriberQueue(orderPlaced, "billing");
const email = subscriberQueue(orderPlaced, "email");
const receipts = defineQueue("receipts");

describe("testTopic", () => {
  it("billing rejects, email delivers, search retries: each subscriber its own outcome, each handler once", async () => {
    const calls: string[] = [];
    const seen: Record<string, Pick<MessageContext, "id" | "queue" | "topic" | "key" | "headers">> = {};
    const record = (m: MessageContext) => {
      calls.push(m.queue);
      seen[m.queue] = { id: m.id, queue: m.queue, topic: m.topic, key: m.key, headers: m.headers };
    };
    const run = testTopic(
      {
        billing: handle(billing, (_p, m) => {
          record(m);
          throw new PermanentError("card declined");
        }),
        email: handle(email, (p, m) => {
          record(m);
          m.publish(receipts, { to: p.orderId, currency: p.currency });
        }),
        search: {
          handler: (_p, m) => {
            record(m);
            throw new TransientError("index busy");
          },
          retry: constant(5_000),
        },
      },
      { maxAttempts: 3 },
    );
    const outcomes = await run(
      orderPlaced,
      { orderId: "o-1", total: 12 },
      { key: "customer-7", headers: { tenant: "acme" } },
    );
    expect(Object.keys(outcomes)).toEqual(["billing", "email", "search"]);
    expect(outcomes.billing).toMatchObject({
      kind: "dead",
      reason: "rejected",
      error: "PermanentError: card declined",
    });
    // The topic's schema ran at publish: the default is in every copy.
    expect(outcomes.email).toMatchObject({
      kind: "acked",
      followUps: [{ queue: "receipts", payload: { to: "o-1", currency: "EUR" } }],
    });
    expect(outcomes.search).toMatchObject({ kind: "retried", delayMs: 5_000, transient: true, failures: 0 });
    expect(calls.sort()).toEqual(["billing", "email", "search"]);
    // Each copy: its own id (queue-name order, as the database writes them), the topic, the event's key and
    // headers plus outbox-topic.
    expect(Object.values(seen).map((m) => [m.queue, m.id])).toEqual([
      ["billing", "1"],
      ["email", "2"],
      ["search", "3"],
    ]);
    for (const m of Object.values(seen)) {
      expect(m).toMatchObject({
        topic: "order.placed",
        key: "customer-7",
        headers: { tenant: "acme", "outbox-topic": "order.placed" },
      });
    }
  });

  it("a subscriber whose subscribe patterns do not match gets no copy; with none matching, no outcome", async () => {
    const ran: string[] = [];
    const handler = (_p: unknown, m: MessageContext) => void ran.push(m.queue);
    const run = testTopic({
      orders: { handler, subscribe: ["order.*"] },
      everything: { handler, subscribe: ["#"] },
      payments: { handler, subscribe: ["payment.*", "order.placed.eu"] },
      unsaid: handler,
    });
    expect(Object.keys(await run("order.placed", { n: 1 }))).toEqual(["everything", "orders", "unsaid"]);
    expect(Object.keys(await run("payment.failed", { n: 1 }))).toEqual(["everything", "payments", "unsaid"]);
    const none = testTopic({ payments: { handler, subscribe: ["payment.*"] } });
    expect(await none("order.placed", {})).toEqual({});
    expect(ran.sort()).toEqual(["everything", "everything", "orders", "payments", "unsaid", "unsaid"]);
  });

  it("refuses the event as publishToTopic does: the topic's schema, a bad topic name, the reserved header", async () => {
    const ran: string[] = [];
    const run = testTopic({ billing: handle(billing, (_p, m) => void ran.push(m.queue)) });
    await expect(run(orderPlaced, { orderId: 1 })).rejects.toThrow(OutboxPayloadError);
    await expect(run(orderPlaced, { orderId: 1 })).rejects.toThrow(/order\.placed.*orderId/);
    await expect(run("order.*", {})).rejects.toThrow(/not a topic name/);
    await expect(run("order.placed", {}, { headers: { "outbox-topic": "x" } })).rejects.toThrow(/reserved/);
    expect(ran).toEqual([]);
  });

  it("each subscriber checks its own schema: a stricter queue dead-letters invalid_payload, the others deliver", async () => {
    const strict = defineQueue("strict", z.object({ orderId: z.string().startsWith("o-") }));
    const got: unknown[] = [];
    const run = testTopic({ strict: handle(strict, () => {}), loose: (p) => void got.push(p) });
    expect(await run(orderPlaced, { orderId: "x-1", total: 1, extra: true })).toMatchObject({
      strict: { kind: "dead", reason: "invalid_payload" },
      loose: { kind: "acked" },
    });
    // A schema-less subscriber gets what publish stored: the topic schema's output (default in, extra out).
    expect(got).toEqual([{ orderId: "x-1", total: 1, currency: "EUR" }]);
  });

  it("times out a hanging subscriber on the shared clock; the quick one is acked all the same", async () => {
    const clock = createManualClock();
    const run = testTopic(
      {
        slow: {
          handler: (_p, m) =>
            new Promise<void>((resolve) => m.signal.addEventListener("abort", () => resolve())),
          timeoutMs: 10_000,
        },
        quick: async () => {},
      },
      { clock },
    );
    const pending = run("order.placed", {});
    clock.advance(10_000);
    expect(await pending).toMatchObject({
      slow: { kind: "retried", timedOut: true },
      quick: { kind: "acked" },
    });
  });

  it("refuses a bad subscriber setting as createWorker would, naming the queue", () => {
    expect(() => testTopic({ billing: { handler: () => {}, subscribe: ["order..x"] } })).toThrow(
      /queues\.billing\.subscribe\[0\]/,
    );
    expect(() => testTopic({ "bad queue": () => {} })).toThrow(/bad queue/);
  });
});
