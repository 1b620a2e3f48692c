import { describe, expect, it } from "vitest";
import { Completer, type Outcome } from "../../src/complete/completer.js";
import { Heartbeat } from "../../src/complete/heartbeat.js";
import { deliveryKey } from "../../src/sql/complete.js";
import type { LeasedRow } from "../../src/sql/fetch.js";
import type { HeldRow } from "../../src/worker/held.js";

/**
 * DESIGN §4.10: bookkeeping by (id, token). One worker can hold two deliveries of a row (its own lease ran
 * out and it leased the row again); what a write touched is credited to the delivery it names, never to
 * every delivery of the same id.
 */
function held(id: string, token: string, state: HeldRow["state"] = "running"): HeldRow {
  const row = { id, queue: "q", payload: "{}", headers: {}, key: null } as unknown as LeasedRow;
  return { row, token, state, writing: false, controller: undefined, startedAt: 0 };
}

describe("delivery keys", () => {
  it("the completer credits a write to the delivery it names: the old delivery of the same row is lost", async () => {
    const old = held("7", "token-old");
    const fresh = held("7", "token-new");
    const landed: HeldRow[] = [];
    const lost: HeldRow[] = [];
    let done!: () => void;
    const flushed = new Promise<void>((resolve) => {
      done = resolve;
    });
    const completer = new Completer({
      // Only the new delivery still owns the row.
      ack: async () => new Set([deliveryKey("7", "token-new")]),
      retry: async () => "all",
      dead: async () => "all",
      landed: (o: Outcome) => landed.push(o.held),
      lost: (o: Outcome) => lost.push(o.held),
      flushed: () => done(),
      onError: () => {},
      onFatal: () => {},
      batchSize: 10,
      windowMs: 1,
      backoffBaseMs: 1,
      backoffMaxMs: 1,
      maxConsecutiveFailures: 3,
    });
    completer.submit({ kind: "ack", held: old, durationMs: 1 });
    completer.submit({ kind: "ack", held: fresh, durationMs: 1 });
    await flushed;
    expect(landed).toEqual([fresh]);
    expect(lost).toEqual([old]);
  });

  it("the heartbeat keeps the delivery whose (id, token) was renewed and reports the other one lost", async () => {
    const old = held("7", "token-old");
    const fresh = held("7", "token-new");
    const lost: HeldRow[] = [];
    const heartbeat = new Heartbeat({
      intervalMs: 60_000,
      collect: () => [old, fresh],
      renew: async () => new Set([deliveryKey("7", "token-new")]),
      lost: (h) => lost.push(h),
      onError: () => {},
      onRecovered: () => {},
    });
    await heartbeat.beat();
    expect(lost).toEqual([old]);
  });
});
