import type { Logger } from "pino";
import type { Handler } from "../worker/options.js";

/**
 * A built-in handler that forwards each message to a broker. Its handler throws TransientError (or a
 * network error) for an unreachable broker, so outages are retried without counting towards maxAttempts,
 * and PermanentError for a message the broker will never accept.
 */
export interface Relay {
  readonly kind: string;
  readonly handler: Handler;
  close(): Promise<void>;
}

/** What every relay factory needs besides its config. */
export interface RelayDeps {
  logger: Logger;
}
