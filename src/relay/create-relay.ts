import { parseRelayConfig, type RelayConfigInput, relayConfigSchema } from "./config.js";
import type { Relay, RelayDeps } from "./relay.js";

/**
 * The relay a config describes, connected when its broker is reachable. An unreachable broker does not
 * fail startup: its messages fail as transient until it comes back. A bad config throws OutboxConfigError.
 *
 * Each relay module is imported only when a relay of its type is configured, so importing the package
 * (a producer-only app, a worker with handlers) never loads the broker clients amqplib, ioredis or nats.
 */
export async function createRelay(input: RelayConfigInput, deps: RelayDeps): Promise<Relay> {
  const config = parseRelayConfig(relayConfigSchema, input);
  switch (config.type) {
    case "http": {
      const { createHttpRelay } = await import("./http.js");
      return createHttpRelay(config, deps);
    }
    case "redis": {
      const { createRedisRelay } = await import("./redis.js");
      return createRedisRelay(config, deps);
    }
    case "nats": {
      const { createNatsRelay } = await import("./nats.js");
      return createNatsRelay(config, deps);
    }
    case "rabbitmq": {
      const { createRabbitmqRelay } = await import("./rabbitmq.js");
      return createRabbitmqRelay(config, deps);
    }
  }
}
