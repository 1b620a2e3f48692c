import { afterEach, describe, expect, it, vi } from "vitest";
import { createRefusalLog, type RefusalEvent } from "../../src/console/refusal-log.js";
import { memoryLogger } from "../support/memory-logger.js";

const refusal = (client: string, kind: RefusalEvent["kind"] = "token"): RefusalEvent => ({
  client,
  kind,
  method: "GET",
  path: "/console/api/peek",
  status: 403,
  error: "wrong token",
});

afterEach(() => {
  vi.useRealTimers();
});

describe("console refusal log", () => {
  it("logs a client's first refusal at once, then one line a minute with the count it held back", () => {
    vi.useFakeTimers();
    const { lines, logger } = memoryLogger();
    const log = createRefusalLog(logger, 60_000);
    for (let i = 0; i < 40; i++) log.record(refusal("10.0.0.7"));
    log.record(refusal("10.0.0.8"));
    log.record(refusal("10.0.0.7", "host"));
    expect(lines.map((l) => [l.client, l.kind, l.suppressed])).toEqual([
      ["10.0.0.7", "token", 0],
      ["10.0.0.8", "token", 0],
      ["10.0.0.7", "host", 0],
    ]);

    vi.advanceTimersByTime(59_999);
    expect(lines).toHaveLength(3);
    vi.advanceTimersByTime(1);
    // The 39 held back, in one line; the clients with nothing held back write nothing.
    expect(lines.slice(3)).toEqual([
      expect.objectContaining({
        client: "10.0.0.7",
        kind: "token",
        suppressed: 39,
        msg: "console refused a token (39 more from this client in the last 60 s)",
      }),
    ]);

    // Still throttled in the next minute: the next refusal waits for its summary line.
    log.record(refusal("10.0.0.7"));
    expect(lines).toHaveLength(4);
    vi.advanceTimersByTime(60_000);
    expect(lines.slice(4)).toEqual([expect.objectContaining({ client: "10.0.0.7", suppressed: 1 })]);

    // A quiet minute ends the window: the next refusal is logged at once again.
    vi.advanceTimersByTime(60_000);
    log.record(refusal("10.0.0.7"));
    expect(lines.slice(5)).toEqual([expect.objectContaining({ client: "10.0.0.7", suppressed: 0 })]);

    log.record(refusal("10.0.0.7"));
    log.close();
    expect(lines.slice(6)).toEqual([expect.objectContaining({ client: "10.0.0.7", suppressed: 1 })]);
    expect(vi.getTimerCount()).toBe(0);
  });

  it("keeps at most 1000 clients apart: a spray of addresses shares one line", () => {
    vi.useFakeTimers();
    const { lines, logger } = memoryLogger();
    const log = createRefusalLog(logger, 60_000);
    for (let i = 0; i < 1500; i++) log.record(refusal(`10.0.${Math.floor(i / 256)}.${i % 256}`));
    // 1000 clients, then one line for all the others.
    expect(lines).toHaveLength(1001);
    log.close();
  });
});
