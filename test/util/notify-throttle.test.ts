import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { NotifyThrottle } from "../../src/util/notify-throttle.js";

/** A throttle on a fake clock whose timers run when the test advances time. */
function harness(cooldownMs: number, withTrailing = true, maxCooldownMs?: number) {
  let now = 0;
  const timers: { at: number; fn: () => void }[] = [];
  const trailing: { queue: string; at: number }[] = [];
  const throttle = new NotifyThrottle({
    cooldownMs,
    maxCooldownMs,
    trailing: withTrailing ? (queue) => trailing.push({ queue, at: now }) : undefined,
    now: () => now,
    schedule: (fn, ms) => timers.push({ at: now + ms, fn }),
  });
  return {
    throttle,
    trailing,
    advanceTo(t: number) {
      for (;;) {
        timers.sort((a, b) => a.at - b.at);
        const next = timers[0];
        if (!next || next.at > t) break;
        timers.shift();
        now = next.at;
        next.fn();
      }
      now = t;
    },
  };
}

describe("NotifyThrottle", () => {
  it("notifies the first publish of a window in its transaction and covers the rest with one trailing", () => {
    const h = harness(10);
    expect(h.throttle.claim("a")).toBe(true);
    h.advanceTo(2);
    expect(h.throttle.claim("a")).toBe(false);
    h.advanceTo(5);
    expect(h.throttle.claim("a")).toBe(false);
    expect(h.throttle.claim("b")).toBe(true); // queues are throttled independently
    h.advanceTo(10);
    expect(h.trailing).toEqual([{ queue: "a", at: 10 }]);
    // The trailing notification opened a new window.
    h.advanceTo(15);
    expect(h.throttle.claim("a")).toBe(false);
    h.advanceTo(40);
    expect(h.trailing.map((t) => t.at)).toEqual([10, 20]);
    expect(h.throttle.claim("a")).toBe(true);
  });

  it("sends no trailing notification when nothing was suppressed", () => {
    const h = harness(10);
    h.throttle.claim("a");
    h.advanceTo(100);
    expect(h.trailing).toEqual([]);
  });

  it("a cooldown of 0 notifies every publish", () => {
    const h = harness(0);
    expect([h.throttle.claim("a"), h.throttle.claim("a"), h.throttle.claim("a")]).toEqual([true, true, true]);
  });

  it("property: every publish is covered by a notification no later than one cooldown after it", () => {
    fc.assert(
      fc.property(
        fc.integer({ min: 1, max: 50 }),
        fc.array(fc.tuple(fc.integer({ min: 0, max: 30 }), fc.constantFrom("a", "b", "c")), {
          maxLength: 60,
        }),
        (cooldown, steps) => {
          const h = harness(cooldown);
          let t = 0;
          const publishes: { queue: string; at: number; leading: boolean }[] = [];
          const leading: { queue: string; at: number }[] = [];
          for (const [gap, queue] of steps) {
            t += gap;
            h.advanceTo(t);
            const lead = h.throttle.claim(queue);
            publishes.push({ queue, at: t, leading: lead });
            if (lead) leading.push({ queue, at: t });
          }
          h.advanceTo(t + cooldown * 3);
          const notes = [...leading, ...h.trailing];
          for (const p of publishes) {
            const covered = notes.some((n) => n.queue === p.queue && n.at >= p.at && n.at <= p.at + cooldown);
            if (!covered) return false;
          }
          // At most one in-transaction notification per queue per cooldown window.
          for (const q of ["a", "b", "c"]) {
            const times = leading.filter((n) => n.queue === q).map((n) => n.at);
            for (let i = 1; i < times.length; i++) {
              if ((times[i] ?? 0) - (times[i - 1] ?? 0) < cooldown) return false;
            }
          }
          return true;
        },
      ),
      { numRuns: 300 },
    );
  });

  it("an adaptive window grows while publishes are dense and shrinks back when they thin out", () => {
    const h = harness(2, true, 8);
    // 1 publish every 0.25 ms for 40 ms: dense. The first notifies in its transaction; the trailing
    // notification at each window's end covers the rest and opens the next window.
    for (let t = 0; t < 40; t += 0.25) {
      h.advanceTo(t);
      h.throttle.claim("a");
    }
    const at = [0, ...h.trailing.map((n) => n.at)];
    const windows = at.slice(1).map((t, i) => t - (at[i] ?? 0));
    // The first window is the shortest (no rate known yet); at 4,000 a second every later one is the max.
    expect(windows[0]).toBe(2);
    expect(windows.slice(1).every((w) => w === 8)).toBe(true);
    // Then one publish every 20 ms: each notifies in its own transaction, and the window is back to 2 ms.
    const sparse: boolean[] = [];
    for (let t = 100; t < 300; t += 20) {
      h.advanceTo(t);
      sparse.push(h.throttle.claim("a"));
    }
    expect(sparse.every(Boolean)).toBe(true);
    h.advanceTo(400);
    expect([h.throttle.claim("a"), h.throttle.claim("a")]).toEqual([true, false]);
    // The second one is covered by the trailing notification 2 ms later: the window is back to 2 ms.
    h.advanceTo(410);
    expect(h.trailing.at(-1)?.at).toBe(402);
  });

  it("an adaptive window stays the shortest at a steady 500 publishes a second, bursts and all", () => {
    // Arrivals of independent producers (exponential gaps, mean 2 ms): some windows see several at once.
    // Counting each window's publishes let such a burst double the window, and only an empty window
    // halved it, so it stayed at 8 ms and a covered message waited about 4 ms for its wake-up.
    const h = harness(2, true, 8);
    let seed = 42;
    const random = () => {
      seed = (seed * 16_807) % 2_147_483_647;
      return seed / 2_147_483_647;
    };
    let t = 0;
    const publishes: number[] = [];
    const leading: number[] = [];
    for (let i = 0; i < 5_000; i++) {
      t += -Math.log(1 - random()) * 2;
      h.advanceTo(t);
      if (h.throttle.claim("a")) leading.push(t);
      publishes.push(t);
    }
    h.advanceTo(t + 100);
    const notes = [...leading, ...h.trailing.map((n) => n.at)].sort((a, b) => a - b);
    let j = 0;
    const waits = publishes.map((p) => {
      while ((notes[j] ?? Number.POSITIVE_INFINITY) < p) j++;
      return (notes[j] ?? Number.POSITIVE_INFINITY) - p;
    });
    // Each publish is covered by a notification within the shortest window.
    expect(Math.max(...waits)).toBeLessThanOrEqual(2);
  });

  it("an adaptive window grows with the square of the rate above 1,000 publishes a second, up to the max", () => {
    const windowAt = (gapMs: number) => {
      const h = harness(2, true, 8);
      for (let t = 0; t < 200; t += gapMs) {
        h.advanceTo(t);
        h.throttle.claim("a");
      }
      const at = h.trailing.map((n) => n.at);
      return (at.at(-1) ?? 0) - (at.at(-2) ?? 0);
    };
    expect(windowAt(1)).toBe(2);
    expect(windowAt(0.8)).toBeCloseTo(3.125, 5);
    expect(windowAt(0.5)).toBe(8);
    expect(windowAt(0.25)).toBe(8);
    expect(windowAt(0.1)).toBe(8);
  });

  it("property: with an adaptive window, every publish is covered within the longest window, and in-transaction notifications are at least the shortest apart", () => {
    fc.assert(
      fc.property(
        fc.array(fc.tuple(fc.double({ min: 0, max: 12, noNaN: true }), fc.constantFrom("a", "b")), {
          maxLength: 200,
        }),
        (steps) => {
          const [min, max] = [2, 8];
          const h = harness(min, true, max);
          let t = 0;
          const publishes: { queue: string; at: number }[] = [];
          const leading: { queue: string; at: number }[] = [];
          for (const [gap, queue] of steps) {
            t += gap;
            h.advanceTo(t);
            if (h.throttle.claim(queue)) leading.push({ queue, at: t });
            publishes.push({ queue, at: t });
          }
          h.advanceTo(t + max * 3);
          const notes = [...leading, ...h.trailing];
          for (const p of publishes) {
            if (!notes.some((n) => n.queue === p.queue && n.at >= p.at && n.at <= p.at + max)) return false;
          }
          for (const q of ["a", "b"]) {
            const times = leading.filter((n) => n.queue === q).map((n) => n.at);
            for (let i = 1; i < times.length; i++)
              if ((times[i] ?? 0) - (times[i - 1] ?? 0) < min) return false;
          }
          return true;
        },
      ),
      { numRuns: 300 },
    );
  });
});
