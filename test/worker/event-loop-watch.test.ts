import { describe, expect, it } from "vitest";
import { EventLoopWatch } from "../../src/worker/event-loop-watch.js";

describe("EventLoopWatch", () => {
  it("reports a tick that came late by the threshold or more, with how long the loop was away", () => {
    let now = 0;
    const blocked: number[] = [];
    const watch = new EventLoopWatch({
      tickMs: 100,
      thresholdMs: 500,
      now: () => now,
      onBlocked: (ms) => blocked.push(ms),
    });
    watch.start();
    watch.stop();
    now = 100;
    watch.tick(); // on time
    now = 250;
    watch.tick(); // 50 ms late: below the threshold
    now = 2250;
    watch.tick(); // 1900 ms late: the loop was away for 2000 ms
    now = 2350;
    watch.tick();
    expect(blocked).toEqual([2000]);
  });
});
