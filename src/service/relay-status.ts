import type { RelayHealth, RelayState } from "../relay/health.js";
import type { Relay } from "../relay/relay.js";
import { scrubSecrets } from "../util/redact.js";
import { timeBound } from "./time-bound.js";

/** One relay in the report: its type and health, credentials hidden. */
export type RelayReport = { type: string } & RelayHealth;

/**
 * Whether each built-in relay reaches its target, by queue: what `GET /relays`, the `outbox_relay_state`
 * gauge and the console's relay panel show. Never part of readiness: a broker that is down delays its
 * queue's messages (they retry), and taking the worker out of rotation would not bring it back.
 */
export interface RelaysReport {
  /** Every relay is `ok` (true when there is none). */
  ok: boolean;
  relays: Record<string, RelayReport>;
}

export interface RelayStatus {
  /** The relays' health now; probes bounded by the timeout, concurrent calls share one round. */
  check(): Promise<RelaysReport>;
}

/** Every state a relay can report, for gauges that need one series each. */
export const RELAY_STATES = Object.keys({
  connecting: true,
  ok: true,
  unreachable: true,
  misconfigured: true,
} satisfies Record<RelayState, true>) as RelayState[];

const DEFAULT_TIMEOUT_MS = 2000;

export function createRelayStatus(opts: {
  relays: Record<string, Pick<Relay, "kind" | "health">>;
  /** Bound on each relay's probe. */
  timeoutMs?: number;
}): RelayStatus {
  const timeoutMs = opts.timeoutMs ?? DEFAULT_TIMEOUT_MS;
  let inflight: Promise<RelaysReport> | undefined;

  // A broker's answer may quote a URL it was given: served only scrubbed.
  const describe = (error: unknown) => scrubSecrets(error instanceof Error ? error.message : String(error));

  async function one(queue: string, relay: Pick<Relay, "kind" | "health">): Promise<RelayReport> {
    try {
      const health = await timeBound(relay.health(), timeoutMs, `relay ${queue} check`);
      const report: RelayReport = { type: relay.kind, ...health, target: scrubSecrets(health.target) };
      if (health.error !== undefined) report.error = describe(health.error);
      return report;
    } catch (error) {
      return { type: relay.kind, state: "unreachable", target: "", error: describe(error) };
    }
  }

  async function run(): Promise<RelaysReport> {
    const entries = await Promise.all(
      Object.entries(opts.relays).map(async ([queue, relay]) => [queue, await one(queue, relay)] as const),
    );
    return { ok: entries.every(([, r]) => r.state === "ok"), relays: Object.fromEntries(entries) };
  }

  return {
    check() {
      inflight ??= run().finally(() => {
        inflight = undefined;
      });
      return inflight;
    },
  };
}
