import net from "node:net";
import { connect as natsConnect } from "nats";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { RelayConfigInput } from "../../src/relay/config.js";
import { serviceConfigSchema } from "../../src/service/config.js";
import { startService } from "../../src/service/service.js";
import { HOST, NATS_PORT, probeBrokers, RABBIT_URL, REDIS_PORT } from "../support/brokers.js";
import { testDatabase } from "../support/database.js";
import { memoryLogger } from "../support/memory-logger.js";
import { duplicateKeys } from "../support/strict-json.js";

/**
 * Every line the service logs while starting its relays is JSON a strict parser takes: no key twice (the
 * service bound `relay` on the logger it gave each relay, which binds `relay` itself). Each kind of relay
 * line is made here: ready/connected, unreachable at startup, target unusable.
 */
const db = testDatabase("rlog");
const RUN = `${Date.now().toString(36)}${process.pid.toString(36)}`;
const { redisDown, natsDown, rabbitDown } = await probeBrokers("relay-log-lines.test");

/** A port nothing listens on: connecting is refused at once. */
async function closedPort(): Promise<number> {
  const server = net.createServer();
  await new Promise<void>((resolve) => server.listen(0, HOST, resolve));
  const { port } = server.address() as net.AddressInfo;
  await new Promise((resolve) => server.close(resolve));
  return port;
}

const stream = `outbox_rlog_${RUN}`;
beforeAll(() => db.migrate());
afterAll(async () => {
  if (natsDown) return;
  const nc = await natsConnect({ servers: `${HOST}:${NATS_PORT}` });
  await (await nc.jetstreamManager()).streams.delete(stream).catch(() => false);
  await nc.close();
});

describe("the service's relay log lines", () => {
  it("name each key once, in every kind of line each relay writes at start", async () => {
    const down = await closedPort();
    // queue → relay, and the messages its lines must include (so each kind is really made here).
    const relays: Record<string, RelayConfigInput> = {
      hook: { type: "http", url: `http://${HOST}:${down}/hook` },
    };
    const expected: [string, string][] = [["hook", "http relay ready"]];
    if (!redisDown) {
      relays["r.ok"] = { type: "redis", url: `redis://${HOST}:${REDIS_PORT}`, stream: `rlog:${RUN}` };
      relays["r.down"] = { type: "redis", url: `redis://${HOST}:${down}`, stream: "x", timeoutMs: 1000 };
      expected.push(["r.ok", "redis relay connected"], ["r.down", "redis unreachable at startup"]);
    }
    if (!natsDown) {
      const nats = `nats://${HOST}:${NATS_PORT}`;
      relays["n.ok"] = { type: "nats", servers: nats, subject: `rlog.${RUN}.ok`, stream };
      relays["n.bad"] = { type: "nats", servers: nats, subject: `rlog.${RUN}.nostream` };
      relays["n.down"] = { type: "nats", servers: `nats://${HOST}:${down}`, subject: "x", timeoutMs: 1000 };
      expected.push(
        ["n.ok", "nats relay connected"],
        ["n.bad", "nats relay target unusable"],
        ["n.down", "nats unreachable at startup"],
      );
    }
    if (!rabbitDown) {
      relays["a.ok"] = { type: "rabbitmq", url: RABBIT_URL, routingKey: "rlog" };
      relays["a.bad"] = { type: "rabbitmq", url: RABBIT_URL, exchange: `rlog-${RUN}`, routingKey: "x" };
      relays["a.down"] = {
        type: "rabbitmq",
        url: `amqp://guest:guest@${HOST}:${down}`,
        routingKey: "x",
        timeoutMs: 1000,
      };
      expected.push(
        ["a.ok", "rabbitmq relay connected"],
        ["a.bad", "rabbitmq relay target unusable"],
        ["a.down", "rabbitmq unreachable at startup"],
      );
    }
    const { logger, lines, raw } = memoryLogger();
    const service = await startService(
      serviceConfigSchema.parse({ databaseUrl: db.url, schema: db.schema, relays }),
      logger,
    );
    await service.stop();

    for (const [queue, msg] of expected) {
      const line = lines.find((l) => l.queue === queue && l.msg.startsWith(msg));
      expect(line, `a "${msg}" line for ${queue}`).toBeDefined();
      // Still said once each: which relay, and which queue it serves.
      expect(line?.relay).toBe(relays[queue]?.type);
    }
    const duplicated = raw.map((line) => ({ line, keys: duplicateKeys(line) })).filter((l) => l.keys.length);
    expect(duplicated).toEqual([]);
  });
});

describe("the strict reader", () => {
  it("finds a key written twice, at any depth, and takes JSON without one", () => {
    expect(duplicateKeys('{"relay":"http","queue":"q","relay":"http"}')).toEqual(["$.relay"]);
    expect(duplicateKeys('{"a":[{"b":1,"b":2}],"c":{"d":{"e":1,"e":1}}}')).toEqual(["$.a[0].b", "$.c.d.e"]);
    expect(duplicateKeys('{"a":"x\\"y","b":[1,-2.5e3,true,null,{}],"c":{"a":1}}')).toEqual([]);
    expect(() => duplicateKeys('{"a":1')).toThrow(/not JSON/);
  });
});
