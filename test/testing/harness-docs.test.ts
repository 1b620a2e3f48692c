import { describe, expect, it } from "vitest";
import { z } from "zod";
import { followUp } from "../../src/contract/follow-up.js";
import type { MessageContext } from "../../src/contract/handler.js";
import { PermanentError } from "../../src/contract/handler-errors.js";
import { defineQueue } from "../../src/produce/queue.js";
import { defineTopic, subscriberQueue } from "../../src/produce/topic.js";
import { constant } from "../../src/retry/strategies.js";
import { createManualClock, testHandler, testTopic } from "../../src/testing/index.js";
import { handle } from "../../src/worker/options.js";

/** The examples of docs/guide/testing-handlers.md, with the app code they assume. */

const order = z.object({ orderId: z.string(), total: z.number() });
const orders = defineQueue("orders", order);
const shipments = defineQueue("shipments", z.object({ orderId: z.string() }));

/** Stands in for a payment provider: hangs for "o-3", refuses negative totals. */
async function pay(orderId: string, total: number, signal: AbortSignal): Promise<void> {
  if (total < 0) throw new Error(`cannot charge ${total}`);
  if (orderId === "o-3") await new Promise((resolve) => signal.addEventListener("abort", resolve));
}

async function chargeOrder(payload: z.output<typeof order>, message: MessageContext) {
  if (payload.total === 0) throw new PermanentError("nothing to charge");
  await pay(payload.orderId, payload.total, message.signal);
  return followUp(shipments, { orderId: payload.orderId });
}

describe("chargeOrder (the docs example)", () => {
  const run = testHandler(handle(orders, chargeOrder, { maxAttempts: 5, retry: constant(30_000) }));

  it("acks and publishes a shipment", async () => {
    const outcome = await run({ orderId: "o-1", total: 12 });
    expect(outcome).toMatchObject({
      kind: "acked",
      followUps: [{ queue: "shipments", payload: { orderId: "o-1" } }],
    });
  });

  it("dead-letters a payload the schema refuses, without running the handler", async () => {
    expect(await run({ orderId: 1 })).toMatchObject({ kind: "dead", reason: "invalid_payload" });
  });

  it("gives up after the last attempt", async () => {
    expect(await run({ orderId: "o-2", total: -1 }, { attempts: 4 })).toMatchObject({
      kind: "dead",
      reason: "retries_exhausted",
    });
  });

  it("times out a payment provider that hangs, without waiting", async () => {
    const clock = createManualClock();
    const slow = testHandler(handle(orders, chargeOrder, { timeoutMs: 10_000 }), { clock });
    const pending = slow({ orderId: "o-3", total: 12 });
    clock.advance(10_000); // the handler's message.signal aborts now
    expect(await pending).toMatchObject({ kind: "retried", timedOut: true });
  });
});

const orderPlaced = defineTopic("order.placed", order);
const receipts = defineQueue("receipts", z.object({ orderId: z.string() }));

async function sendReceipt(payload: z.output<typeof order>) {
  return followUp(receipts, { orderId: payload.orderId });
}

describe("a topic's subscribers (the docs example)", () => {
  it("billing rejects a free order, the receipt goes out all the same", async () => {
    const run = testTopic({
      billing: handle(subscriberQueue(orderPlaced, "billing"), chargeOrder, { subscribe: ["order.placed"] }),
      email: handle(subscriberQueue(orderPlaced, "email"), sendReceipt, { subscribe: ["order.*"] }),
      payments: handle(subscriberQueue(orderPlaced, "payments"), chargeOrder, { subscribe: ["payment.*"] }),
    });
    expect(await run(orderPlaced, { orderId: "o-4", total: 0 }, { key: "customer-7" })).toEqual({
      billing: expect.objectContaining({ kind: "dead", reason: "rejected" }),
      email: expect.objectContaining({ kind: "acked" }),
      // payments' pattern does not match order.placed: no copy, no outcome.
    });
  });
});
