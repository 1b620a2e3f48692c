import { describe, expect, it } from "vitest";
import type { ListenerState } from "../../src/notify/notifier.js";
import { unnamedStatementsReason } from "../../src/worker/pooler-probe.js";

/** When the worker's statements go unnamed before its first fetch (test/worker/pgbouncer.test.ts runs it for real). */
describe("unnamedStatementsReason", () => {
  const cases: [boolean | undefined, ListenerState | undefined, "named" | "unnamed"][] = [
    // Nothing in between: a self-test that failed had another cause (a slow server).
    [false, undefined, "named"],
    [false, "poll_only", "named"],
    [false, "listening", "named"],
    // A pooler, and LISTEN through it works: session mode keeps each connection's statements.
    [true, "listening", "named"],
    // A pooler, and LISTEN through it gets nothing: transaction mode.
    [true, "poll_only", "unnamed"],
    // A pooler whose mode nothing tells (LISTEN off, or at another address): unnamed, which every mode takes.
    [true, undefined, "unnamed"],
    [true, "reconnecting", "unnamed"],
    // The probe could not tell: LISTEN's self-test alone decides.
    [undefined, "poll_only", "unnamed"],
    [undefined, "listening", "named"],
    [undefined, undefined, "named"],
  ];
  it.each(cases)("pooler %s, listener on the pool's address %s: %s", (pooler, listener, expected) => {
    const reason = unnamedStatementsReason({ pooler, listenerOnPoolAddress: listener });
    expect(reason === undefined ? "named" : "unnamed").toBe(expected);
  });
});
