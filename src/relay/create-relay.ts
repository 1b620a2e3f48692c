import { parseRelayConfig, type RelayConfigInput, relayConfigSchema } from "./config.js";
import { createHttpRelay } from "./http.js";
import { createNatsRelay } from "./nats.js";
import { createRabbitmqRelay } from "./rabbitmq.js";
import { createRedisRelay } from "./redis.js";
import type { Relay, RelayDeps } from "./relay.js";

/**
 * The relay a config describes, connected when its broker is reachable. An unreachable broker does not
 * fail startup: its messages fail as transient until it comes back. A bad config throws OutboxConfigError.
 */
export async function createRelay(input: RelayConfigInput, deps: RelayDeps): Promise<Relay> {
  const config = parseRelayConfig(relayConfigSchema, input);
  switch (config.type) {
    case "http":
      return createHttpRelay(config, deps);
    case "redis":
      return createRedisRelay(config, deps);
    case "nats":
      return createNatsRelay(config, deps);
    case "rabbitmq":
      return createRabbitmqRelay(config, deps);
  }
}
