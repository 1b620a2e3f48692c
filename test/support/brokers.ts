import amqp from "amqplib";
import { Redis } from "ioredis";
import { connect as natsConnect } from "nats";

/** The brokers the relay tests talk to, as this machine runs them. */
export const HOST = "127.0.0.1";
export const REDIS_PORT = 6379;
export const NATS_PORT = 4222;
export const RABBIT_URL = `amqp://guest:guest@${HOST}:5672`;

export interface BrokerProbe {
  /** Why each broker's tests are skipped, or undefined when it answers. */
  redisDown: string | undefined;
  natsDown: string | undefined;
  rabbitDown: string | undefined;
}

/** Undefined when the probe answers within 3 s; otherwise the reason, printed so a skip is never silent. */
async function unreachable(
  file: string,
  what: string,
  probe: () => Promise<unknown>,
): Promise<string | undefined> {
  let timer: NodeJS.Timeout | undefined;
  try {
    await Promise.race([
      probe(),
      new Promise((_, reject) => {
        timer = setTimeout(() => reject(new Error("no answer within 3 s")), 3000);
      }),
    ]);
    return undefined;
  } catch (error) {
    const reason = `${what} unreachable (${error instanceof Error ? error.message : String(error)})`;
    console.warn(`${file}: skipping tests, ${reason}`);
    return reason;
  } finally {
    clearTimeout(timer);
  }
}

/** Probe Redis, NATS JetStream and RabbitMQ once, for `describe.skipIf` / `it.skipIf` in `file`. */
export async function probeBrokers(file: string): Promise<BrokerProbe> {
  const [redisDown, natsDown, rabbitDown] = await Promise.all([
    unreachable(file, `Redis ${HOST}:${REDIS_PORT}`, async () => {
      const client = new Redis({ host: HOST, port: REDIS_PORT, lazyConnect: true, maxRetriesPerRequest: 0 });
      client.on("error", () => {});
      try {
        await client.connect();
        await client.ping();
      } finally {
        client.disconnect();
      }
    }),
    unreachable(file, `NATS JetStream ${HOST}:${NATS_PORT}`, async () => {
      const nc = await natsConnect({ servers: `${HOST}:${NATS_PORT}`, timeout: 2000, reconnect: false });
      try {
        await (await nc.jetstreamManager()).getAccountInfo();
      } finally {
        await nc.close();
      }
    }),
    unreachable(file, `RabbitMQ ${HOST}:5672`, async () => {
      const model = await amqp.connect(RABBIT_URL, { timeout: 2000 });
      await model.close();
    }),
  ]);
  return { redisDown, natsDown, rabbitDown };
}
