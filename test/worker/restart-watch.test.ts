import pino from "pino";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { RestartWatch } from "../../src/worker/restart-watch.js";

/** When the watch has stale leases taken back, on fake timers: the server's answers are scripted. */
function harness(answers: (string | Error)[]) {
  const calls = { probes: 0, reclaims: 0 };
  let reclaimFails = 0;
  const watch = new RestartWatch({
    serverStarted: async () => {
      const answer = answers[Math.min(calls.probes++, answers.length - 1)] as string | Error;
      if (answer instanceof Error) throw answer;
      return answer;
    },
    reclaim: async () => {
      calls.reclaims++;
      if (reclaimFails > 0) {
        reclaimFails--;
        throw new Error("connection lost");
      }
    },
    everyMs: 10_000,
    backoffBaseMs: 100,
    backoffMaxMs: 1000,
    log: pino({ level: "silent" }),
    random: () => 0.5,
  });
  return {
    watch,
    calls,
    failNextReclaims: (n: number) => {
      reclaimFails = n;
    },
  };
}

const away = new Error("connect ECONNREFUSED");

describe("RestartWatch", () => {
  beforeEach(() => void vi.useFakeTimers());
  afterEach(() => void vi.useRealTimers());

  it("takes back nothing while the server answers with the start time it had and nothing failed", async () => {
    const { watch, calls } = harness(["t0"]);
    watch.start();
    await vi.advanceTimersByTimeAsync(60_000);
    expect(calls.probes).toBe(7);
    expect(calls.reclaims).toBe(0);
    await watch.stop();
  });

  it("after lost contact, takes back once the server answers, even with an unchanged start time", async () => {
    // restart_after_crash reinitialises a server in place: its start time stays, its unflushed WAL is gone.
    const { watch, calls } = harness(["t0", away, away, "t0"]);
    watch.start();
    await vi.advanceTimersByTimeAsync(0);
    watch.lostContact();
    watch.lostContact();
    await vi.advanceTimersByTimeAsync(0);
    expect(calls.reclaims).toBe(0); // the server is away
    await vi.advanceTimersByTimeAsync(5000);
    expect(calls.reclaims).toBe(1);
    await vi.advanceTimersByTimeAsync(60_000);
    expect(calls.reclaims).toBe(1);
    await watch.stop();
  });

  it("takes back when the server's start time changed though no connection failed (a pooler in between)", async () => {
    const { watch, calls } = harness(["t0", "t0", "t1"]);
    watch.start();
    await vi.advanceTimersByTimeAsync(10_000);
    expect(calls.reclaims).toBe(0);
    await vi.advanceTimersByTimeAsync(10_000);
    expect(calls.reclaims).toBe(1);
    await vi.advanceTimersByTimeAsync(60_000);
    expect(calls.reclaims).toBe(1);
    await watch.stop();
  });

  it("a failed reclaim is tried again at the next look", async () => {
    const { watch, calls, failNextReclaims } = harness(["t0"]);
    watch.start();
    await vi.advanceTimersByTimeAsync(0);
    failNextReclaims(2);
    watch.lostContact();
    await vi.advanceTimersByTimeAsync(5000);
    expect(calls.reclaims).toBe(3);
    await vi.advanceTimersByTimeAsync(60_000);
    expect(calls.reclaims).toBe(3);
    await watch.stop();
  });

  it("looks no more once stopped", async () => {
    const { watch, calls } = harness(["t0", "t1"]);
    watch.start();
    await vi.advanceTimersByTimeAsync(0);
    await watch.stop();
    watch.lostContact();
    await vi.advanceTimersByTimeAsync(60_000);
    expect(calls).toEqual({ probes: 1, reclaims: 0 });
  });
});
