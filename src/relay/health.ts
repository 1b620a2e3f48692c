/**
 * How a relay's target looks from here:
 * - `connecting`: no attempt has finished yet;
 * - `ok`: the broker answered and, as far as it told us, the target exists (an HTTP relay starts here:
 *   it has no connection, only requests);
 * - `unreachable`: the broker cannot be reached (down, refused, timing out); messages retry;
 * - `misconfigured`: the broker answered that the target cannot take messages (no stream captures the
 *   subject, the exchange does not exist, nothing is bound, a key of the wrong type); messages retry until
 *   someone fixes the broker or the config.
 */
export type RelayState = "connecting" | "ok" | "unreachable" | "misconfigured";

/** A relay's state, as the service's `/relays` shows it. */
export interface RelayHealth {
  state: RelayState;
  /** Where messages go, credentials hidden, e.g. `nats nats://127.0.0.1:4222 subject orders.shipped`. */
  target: string;
  /** What the broker said, for `unreachable` and `misconfigured`. */
  error?: string;
}

import type { Logger } from "pino";
import { errorMessage } from "../contract/handler-errors.js";
import { throttledLog } from "./throttle.js";

/** The state a relay keeps up to date from its connects and publishes. */
export class RelayHealthTracker {
  readonly #target: string;
  #state: RelayState;
  #error: string | undefined;

  readonly #report: ((problem: string) => void) | undefined;

  /**
   * With `report`, a misconfigured target is also said in one error line per 30 s, whichever way (probe or
   * publish) the same mistake shows up.
   */
  constructor(
    target: string,
    options: { initial?: RelayState; report?: { logger: Logger; relay: string } } = {},
  ) {
    this.#target = target;
    this.#state = options.initial ?? "connecting";
    const { report } = options;
    if (report !== undefined) {
      const logOnce = throttledLog(30_000);
      this.#report = (problem) =>
        logOnce("misconfigured", () =>
          report.logger.error(
            { problem },
            `${report.relay} relay target unusable; messages retry until it is fixed`,
          ),
        );
    }
  }

  get state(): RelayState {
    return this.#state;
  }

  /** The broker answers; a missing target it reported earlier is not fixed by that. */
  reachable(): void {
    if (this.#state === "misconfigured") return;
    this.#state = "ok";
    this.#error = undefined;
  }

  /** A publish went through, or a probe found the target: whatever was wrong is fixed. */
  ok(): void {
    this.#state = "ok";
    this.#error = undefined;
  }

  unreachable(error: unknown): void {
    // A missing target stays the headline while the connection also drops now and then.
    if (this.#state === "misconfigured") return;
    this.#state = "unreachable";
    this.#error = oneLine(error);
  }

  misconfigured(problem: string): void {
    this.#state = "misconfigured";
    this.#error = problem;
    this.#report?.(problem);
  }

  snapshot(): RelayHealth {
    return this.#error === undefined
      ? { state: this.#state, target: this.#target }
      : { state: this.#state, target: this.#target, error: this.#error };
  }
}

/** An error and its causes on one line, for a JSON report. */
function oneLine(error: unknown): string {
  return errorMessage(error, 1000).replaceAll("\ncaused by: ", ": ");
}
