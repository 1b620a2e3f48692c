import type { MetricMakers } from "./metric-makers.js";
import { RELAY_STATES, type RelaysReport } from "./relay-status.js";

/** Each built-in relay's state (`outbox_relay_state`), one series per state. */
export function createRelayGauges(make: MetricMakers): (report: RelaysReport) => void {
  const relayState = make.gauge(
    "outbox_relay_state",
    "1 for a built-in relay's current state (ok, unreachable, misconfigured, connecting), per queue.",
    ["queue", "type", "state"],
  );
  return (report) => {
    for (const [queue, relay] of Object.entries(report.relays)) {
      for (const state of RELAY_STATES) {
        relayState.set({ queue, type: relay.type, state }, state === relay.state ? 1 : 0);
      }
    }
  };
}
