import type { Logger } from "pino";
import { afterEach, expect } from "vitest";
import type { MessageContext } from "../../src/contract/handler.js";
import { classifyError, type ErrorClass } from "../../src/contract/handler-errors.js";
import { createRelay } from "../../src/relay/create-relay.js";
import type { Relay } from "../../src/relay/relay.js";
import { HOST } from "./brokers.js";
import { startTcpProxy, type TcpProxy } from "./tcp-proxy.js";

/** The scenarios every relay test file runs against its broker: bursts, outages, recovery. */

let nextId = BigInt(Date.now()) * 1000n;
/** Fresh outbox ids, unique across test files and runs. */
export function newIds(count: number): string[] {
  return Array.from({ length: count }, () => String(nextId++));
}

export const payloadOf = (id: string) => ({ orderId: id, total: 12.5, items: ["a", "b"] });

export const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** Each id exactly once, except `twice`: exactly two copies of those. */
export function expectDelivered(delivered: string[], ids: string[], twice: ReadonlySet<string> = new Set()) {
  const counts = new Map<string, number>();
  for (const id of delivered) counts.set(id, (counts.get(id) ?? 0) + 1);
  expect([...counts.keys()].sort()).toEqual([...ids].sort());
  const wrong = [...counts].filter(([id, n]) => n !== (twice.has(id) ? 2 : 1));
  expect(wrong, "ids delivered a wrong number of times [id, copies]").toEqual([]);
}

/** Relays and proxies made in a test file are closed after each test, even when it fails. */
export function trackRelays(logger: Logger) {
  const relays: Relay[] = [];
  const proxies: TcpProxy[] = [];
  afterEach(async () => {
    await Promise.all(relays.splice(0).map((r) => r.close()));
    await Promise.all(proxies.splice(0).map((p) => p.close()));
  });
  return {
    /** A relay made elsewhere (with other deps), closed after the test like the others. */
    closeAfter(relay: Relay): void {
      relays.push(relay);
    },
    async relay(config: Parameters<typeof createRelay>[0]): Promise<Relay> {
      const created = await createRelay(config, { logger });
      relays.push(created);
      return created;
    },
    async proxyTo(port: number): Promise<TcpProxy> {
      const proxy = await startTcpProxy({ host: HOST, port });
      proxies.push(proxy);
      return proxy;
    },
  };
}

/** The handler calls of a relay, with the messages `context` makes. */
export function relayScenarios(context: (id: string, queue: string) => MessageContext) {
  /** How one handler call ended: "ok", or how the worker would classify its error. */
  async function outcome(relay: Relay, id: string, queue: string): Promise<"ok" | ErrorClass> {
    try {
      await relay.handler(payloadOf(id), context(id, queue));
      return "ok";
    } catch (error) {
      return classifyError(error);
    }
  }

  async function outcomes(
    relay: Relay,
    ids: string[],
    queue: string,
  ): Promise<Map<string, "ok" | ErrorClass>> {
    const results = await Promise.all(ids.map(async (id) => [id, await outcome(relay, id, queue)] as const));
    return new Map(results);
  }

  /** Retry the ids until each is accepted; every failure on the way must be transient. Bounded in time. */
  async function retryUntilDelivered(relay: Relay, ids: string[], queue: string, timeoutMs = 20_000) {
    const deadline = Date.now() + timeoutMs;
    let pending = ids;
    const failures = new Set<ErrorClass>();
    for (let round = 0; pending.length > 0 && Date.now() < deadline && round < 500; round++) {
      const results = await outcomes(relay, pending, queue);
      pending = pending.filter((id) => results.get(id) !== "ok");
      for (const result of results.values()) if (result !== "ok") failures.add(result);
      if (pending.length > 0) await sleep(200);
    }
    expect(pending, "ids still failing after the broker came back").toEqual([]);
    expect(
      [...failures].filter((f) => f !== "transient"),
      "failures while recovering",
    ).toEqual([]);
  }

  /**
   * The outage scenario shared by every broker. 20 messages are delivered; 10 more reach the broker but
   * their acks are held back when the proxy cuts every connection (the at-least-once case: stored, yet
   * reported failed); 20 more are sent during the outage; then the proxy comes back and every failed id is
   * retried. `landed` counts what the broker has stored. Returns the ids whose acks were lost.
   */
  async function burstThroughOutage(
    relay: Relay,
    proxy: TcpProxy,
    ids: string[],
    queue: string,
    landed: () => Promise<number>,
  ): Promise<Set<string>> {
    const before = await outcomes(relay, ids.slice(0, 20), queue);
    expect([...before.values()], "deliveries before the outage").toEqual(ids.slice(0, 20).map(() => "ok"));

    proxy.holdReplies();
    const inFlight = outcomes(relay, ids.slice(20, 30), queue);
    const deadline = Date.now() + 5000;
    while ((await landed()) < 30 && Date.now() < deadline) await sleep(20);
    expect(await landed(), "messages stored while their acks are held back").toBe(30);
    proxy.cut();
    const lostAcks = await inFlight;
    expect([...lostAcks.values()], "calls whose ack was lost").toEqual(
      ids.slice(20, 30).map(() => "transient"),
    );

    // No settling pause: cut() has destroyed every socket and refuses new ones, so no call from here on can
    // land, and each must fail as transient whether or not the client library has noticed the drop yet.
    const during = await outcomes(relay, ids.slice(30), queue);
    expect([...during.values()], "calls during the outage").toEqual(ids.slice(30).map(() => "transient"));

    proxy.restore();
    await retryUntilDelivered(relay, ids.slice(20), queue);
    return new Set(ids.slice(20, 30));
  }

  return { outcome, outcomes, retryUntilDelivered, burstThroughOutage };
}
