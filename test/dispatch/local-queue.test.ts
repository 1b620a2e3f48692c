import fc from "fast-check";
import { describe, expect, it, vi } from "vitest";
import { LocalQueue } from "../../src/dispatch/local-queue.js";

/** Lets every already-resolved promise run its callbacks. */
const flush = () => new Promise<void>((resolve) => setImmediate(resolve));

/** Records what each take() resolved with, by call order. */
function taker<T>(q: LocalQueue<T>) {
  const results: (T | undefined)[] = [];
  const settled: boolean[] = [];
  return {
    results,
    settled,
    take() {
      const i = settled.push(false) - 1;
      void q.take().then((v) => {
        results[i] = v;
        settled[i] = true;
      });
    },
  };
}

describe("LocalQueue", () => {
  it("rejects a capacity that is not an integer >= 1", () => {
    for (const c of [0, -1, 1.5, Number.NaN, Number.POSITIVE_INFINITY]) {
      expect(() => new LocalQueue(c)).toThrow(RangeError);
    }
    expect(new LocalQueue(1).capacity).toBe(1);
  });

  it("hands out items in FIFO order and reports size and free", async () => {
    const q = new LocalQueue<string>(3);
    q.push(["a", "b"]);
    expect([q.size, q.free]).toEqual([2, 1]);
    expect(await q.take()).toBe("a");
    expect(await q.take()).toBe("b");
    expect([q.size, q.free]).toEqual([0, 3]);
  });

  it("refuses a push beyond capacity and keeps none of it", () => {
    const q = new LocalQueue<number>(3);
    q.push([1]);
    expect(() => q.push([2, 3, 4])).toThrow(RangeError);
    expect(q.size).toBe(1);
    expect(q.drain()).toEqual([1]);
  });

  it("serves waiters in the order they asked", async () => {
    const q = new LocalQueue<number>(5);
    const t = taker(q);
    t.take();
    t.take();
    t.take();
    await flush();
    expect(t.settled).toEqual([false, false, false]);
    q.push([10, 20]);
    await flush();
    expect(t.results).toEqual([10, 20]);
    expect(t.settled).toEqual([true, true, false]);
    expect(q.size).toBe(0);
    q.push([30, 40]);
    await flush();
    expect(t.results).toEqual([10, 20, 30]);
    expect(q.size).toBe(1);
  });

  it("close() resolves pending waiters with undefined and refuses pushes", async () => {
    const q = new LocalQueue<number>(2);
    const t = taker(q);
    t.take();
    t.take();
    q.close();
    q.close();
    await flush();
    expect(t.settled).toEqual([true, true]);
    expect(t.results).toEqual([undefined, undefined]);
    expect(q.closed).toBe(true);
    expect(() => q.push([1])).toThrow(/closed/);
    expect(await q.take()).toBeUndefined();
  });

  it("after close(), queued items are still taken, then takes resolve undefined", async () => {
    const q = new LocalQueue<number>(2);
    q.push([1, 2]);
    q.close();
    expect(await q.take()).toBe(1);
    expect(await q.take()).toBe(2);
    expect(await q.take()).toBeUndefined();
  });

  it("drain() empties the queue without resolving waiters", async () => {
    const q = new LocalQueue<number>(3);
    q.push([1, 2, 3]);
    expect(q.drain()).toEqual([1, 2, 3]);
    expect(q.size).toBe(0);
    const t = taker(q);
    t.take();
    expect(q.drain()).toEqual([]);
    await flush();
    expect(t.settled).toEqual([false]);
    q.push([4]);
    await flush();
    expect(t.results).toEqual([4]);
  });

  it("remove() takes out matching items, keeps the order of the rest, and is atomic if the predicate throws", () => {
    const q = new LocalQueue<number>(6);
    q.push([1, 2, 3, 4, 5, 6]);
    expect(q.remove((n) => n % 2 === 0)).toEqual([2, 4, 6]);
    expect(() =>
      q.remove((n) => {
        if (n === 5) throw new Error("bad predicate");
        return true;
      }),
    ).toThrow("bad predicate");
    expect(q.drain()).toEqual([1, 3, 5]);
  });

  it("calls onTake synchronously with the size after each item leaves via take()", async () => {
    const q = new LocalQueue<number>(3);
    const sizes: number[] = [];
    q.onTake = (size) => {
      expect(q.size).toBe(size);
      sizes.push(size);
    };
    q.push([1, 2, 3]);
    void q.take();
    expect(sizes).toEqual([2]);
    q.drain();
    q.remove(() => true);
    expect(sizes).toEqual([2]);
    const t = taker(q);
    t.take();
    q.push([7, 8]);
    expect(sizes).toEqual([2, 1]);
    await flush();
    expect(t.results).toEqual([7]);
  });

  it("a throwing onTake loses no item and is reported as a process warning", async () => {
    const warn = vi.spyOn(process, "emitWarning").mockImplementation(() => {});
    try {
      const q = new LocalQueue<number>(2);
      q.onTake = () => {
        throw new Error("hook bug");
      };
      q.push([1]);
      expect(await q.take()).toBe(1);
      const t = taker(q);
      t.take();
      q.push([2]);
      await flush();
      expect(t.results).toEqual([2]);
      expect(warn).toHaveBeenCalledTimes(2);
      expect(String(warn.mock.calls[0]?.[0])).toMatch(/hook bug/);
    } finally {
      warn.mockRestore();
    }
  });

  it("keeps waiters FIFO when onTake re-enters take() while a push is serving them", async () => {
    const q = new LocalQueue<number>(4);
    const order: string[] = [];
    let reentered = false;
    q.onTake = () => {
      if (reentered) return;
      reentered = true;
      void q.take().then((v) => order.push(`late:${v}`));
    };
    void q.take().then((v) => order.push(`first:${v}`));
    void q.take().then((v) => order.push(`second:${v}`));
    q.push([1, 2, 3, 4]);
    await flush();
    expect(order).toEqual(["first:1", "second:2", "late:3"]);
    expect(q.drain()).toEqual([4]);
  });

  it("still hands pushed items to waiters when onTake closes the queue mid-push", async () => {
    const q = new LocalQueue<number>(3);
    q.onTake = () => q.close();
    const t = taker(q);
    t.take();
    t.take();
    t.take();
    q.push([1, 2, 3]);
    await flush();
    expect(t.results).toEqual([1, 2, 3]);
    expect(q.size).toBe(0);
    expect(await q.take()).toBeUndefined();
  });

  it("tryTake() hands out the next item synchronously, and nothing while the queue is empty", () => {
    const q = new LocalQueue<string>(3);
    const sizes: number[] = [];
    q.onTake = (size) => sizes.push(size);
    expect(q.tryTake()).toBeUndefined();
    q.push(["a", "b"]);
    expect(q.tryTake()).toBe("a");
    expect(q.tryTake()).toBe("b");
    expect(q.tryTake()).toBeUndefined();
    expect(sizes).toEqual([1, 0]);
  });

  it("accepts a batch far larger than a spread call allows", () => {
    const n = 500_000;
    const q = new LocalQueue<number>(n);
    q.push(Array.from({ length: n }, (_, i) => i));
    expect(q.size).toBe(n);
    expect(q.free).toBe(0);
  });

  type Op =
    | { t: "push"; n: number }
    | { t: "take" }
    | { t: "tryTake" }
    | { t: "remove"; mod: number; rem: number }
    | { t: "drain" }
    | { t: "close" };

  const opArb: fc.Arbitrary<Op> = fc.oneof(
    {
      weight: 4,
      arbitrary: fc.record({ t: fc.constant("push" as const), n: fc.integer({ min: 0, max: 7 }) }),
    },
    { weight: 5, arbitrary: fc.constant({ t: "take" as const }) },
    { weight: 3, arbitrary: fc.constant({ t: "tryTake" as const }) },
    {
      weight: 1,
      arbitrary: fc.record({
        t: fc.constant("remove" as const),
        mod: fc.integer({ min: 1, max: 3 }),
        rem: fc.integer({ min: 0, max: 2 }),
      }),
    },
    { weight: 1, arbitrary: fc.constant({ t: "drain" as const }) },
    { weight: 1, arbitrary: fc.constant({ t: "close" as const }) },
  );

  it("property: model-checked against an array, no item is lost, duplicated or held beyond capacity", async () => {
    await fc.assert(
      fc.asyncProperty(
        fc.integer({ min: 1, max: 5 }),
        fc.array(opArb, { maxLength: 60 }),
        async (capacity, ops) => {
          const q = new LocalQueue<number>(capacity);
          let model: number[] = [];
          let closed = false;
          let waiting: number[] = [];
          const expected = new Map<number, number | undefined>();
          const actual = new Map<number, number | undefined>();
          const expectedSizes: number[] = [];
          const sizes: number[] = [];
          q.onTake = (size) => sizes.push(size);
          const pushed: number[] = [];
          const out: number[] = [];
          let nextItem = 0;
          let nextTaker = 0;

          const serve = () => {
            while (waiting.length > 0 && model.length > 0) {
              expected.set(waiting.shift() as number, model.shift());
              expectedSizes.push(model.length);
            }
          };

          for (const op of ops) {
            switch (op.t) {
              case "push": {
                const items = Array.from({ length: op.n }, () => nextItem++);
                if (closed) {
                  expect(() => q.push(items)).toThrow(/closed/);
                } else if (op.n > capacity - model.length) {
                  expect(() => q.push(items)).toThrow(RangeError);
                } else {
                  q.push(items);
                  pushed.push(...items);
                  model.push(...items);
                  serve();
                }
                break;
              }
              case "take": {
                const id = nextTaker++;
                void q.take().then((v) => {
                  expect(actual.has(id)).toBe(false);
                  actual.set(id, v);
                  if (v !== undefined) out.push(v);
                });
                if (model.length > 0) {
                  expected.set(id, model.shift());
                  expectedSizes.push(model.length);
                } else if (closed) {
                  expected.set(id, undefined);
                } else {
                  waiting.push(id);
                }
                break;
              }
              case "tryTake": {
                const item = q.tryTake();
                // Only an item nobody waits for: a waiter, if any, is served first (by push).
                if (waiting.length > 0 || model.length === 0) {
                  expect(item).toBeUndefined();
                } else {
                  expect(item).toBe(model.shift());
                  expectedSizes.push(model.length);
                  out.push(item as number);
                }
                break;
              }
              case "remove": {
                const pred = (n: number) => n % op.mod === op.rem;
                const removed = q.remove(pred);
                expect(removed).toEqual(model.filter(pred));
                model = model.filter((n) => !pred(n));
                out.push(...removed);
                break;
              }
              case "drain": {
                const drained = q.drain();
                expect(drained).toEqual(model);
                model = [];
                out.push(...drained);
                break;
              }
              case "close": {
                q.close();
                closed = true;
                if (model.length === 0) {
                  for (const id of waiting) expected.set(id, undefined);
                  waiting = [];
                }
                break;
              }
            }
            expect(q.size).toBeLessThanOrEqual(capacity);
            expect(q.size).toBe(model.length);
            expect(q.free).toBe(capacity - model.length);
            expect(q.closed).toBe(closed);
            expect(sizes).toEqual(expectedSizes);
            await flush();
            expect(actual).toEqual(expected);
          }

          // Stop: release what is queued, then every remaining waiter must be let go.
          out.push(...q.drain());
          q.close();
          await flush();
          expect(actual.size).toBe(nextTaker);
          expect([...out].sort((a, b) => a - b)).toEqual(pushed);
        },
      ),
      { numRuns: 300 },
    );
  });
});
