import type { Logger } from "pino";
import type { Handler } from "../contract/handler.js";
import type { RelayHealth } from "./health.js";

/**
 * A built-in handler that forwards each message to a broker. Its handler throws TransientError (or a
 * network error) for an unreachable broker, so outages are retried without counting towards maxAttempts,
 * and PermanentError for a message the broker will never accept.
 */
export interface Relay {
  readonly kind: string;
  readonly handler: Handler;
  /**
   * Whether the target can take messages: what the last connect and publish said, refreshed by a cheap
   * probe of the broker where there is one (bounded by the relay's `timeoutMs`). `/relays` shows it.
   */
  health(): Promise<RelayHealth>;
  close(): Promise<void>;
}

/** What every relay factory needs besides its config. */
export interface RelayDeps {
  logger: Logger;
  /** The queue this relay serves, when it is one: lets a probe check the target `{queue}` names. */
  queue?: string;
  /**
   * The CloudEvents `source` when the relay config sets no `eventSource` (the service passes
   * `/outbox/<database>/<schema>`, see `defaultEventSource`); unset: `/outbox`.
   */
  source?: string;
}
