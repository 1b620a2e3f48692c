import { describe, expect, it } from "vitest";
import { type HeldNow, Prefetch } from "../../src/worker/prefetch.js";

const idle: HeldNow = { queued: 0, completing: 0, held: 0, heldBytes: 0, handlerMs: undefined };
const prefetch = (maxHeldBytes = 1e9) => new Prefetch({ capacity: 20, concurrency: 4, maxHeldBytes });

describe("Prefetch", () => {
  it("asks for one loop's worth ahead until a handler finished", () => {
    expect(prefetch().free(idle)).toBe(8);
    // Rows already held and not completing count against it; completing ones do not.
    expect(prefetch().free({ ...idle, queued: 2, held: 5, completing: 1 })).toBe(4);
  });

  it("keeps the fetch in flight's room and the local queue's bound", () => {
    const p = prefetch();
    p.reserve(15);
    expect(p.free(idle)).toBe(5);
    p.unreserve();
    expect(p.free(idle)).toBe(8);
    expect(p.free({ ...idle, queued: 18, held: 18, handlerMs: 0.001 })).toBe(2);
  });

  it("asks for as many rows as the loops start before the next fetch lands", () => {
    const p = prefetch();
    // Slow handlers: a few rows beyond the loops, not a queue's worth another worker could run.
    expect(p.free({ ...idle, handlerMs: 1000 })).toBe(5);
    // Fast handlers: the room is the bound.
    expect(p.free({ ...idle, handlerMs: 0.01 })).toBe(20);
    // A slower round trip lets more rows wait.
    p.fetched(0, 0, 1000);
    expect(p.free({ ...idle, handlerMs: 1000 })).toBe(6);
  });

  it("counts a big fetch's round trip as if it had carried at most a megabyte", () => {
    const small = prefetch();
    const big = prefetch();
    small.fetched(1, 2 ** 20, 2000);
    big.fetched(1, 2 ** 24, 2000);
    const slow = { ...idle, handlerMs: 1000 };
    // Round trips of 0.8 + 400 ms and 0.8 + 2000 / 16 * 0.2 = 25.8 ms: 4 and 1 rows beyond the 4 loops.
    expect(small.free(slow)).toBe(8);
    expect(big.free(slow)).toBe(5);
  });

  it("asks for no more rows than fit in the byte budget left, at least one while nothing is held", () => {
    const p = prefetch(5000);
    // Row size unknown: the statement's byte cut alone decides.
    expect(p.free(idle)).toBe(8);
    expect(p.free({ ...idle, held: 1, heldBytes: 5000 })).toBe(0);
    p.fetched(10, 10_000, 1);
    expect(p.free({ ...idle, held: 2, heldBytes: 2000 })).toBe(3);
    expect(p.free({ ...idle, held: 4, heldBytes: 5000 })).toBe(0);
    expect(prefetchWithRows(5000, 10_000).free(idle)).toBe(1);
  });

  it("learns a larger row size at once and a smaller one slowly", () => {
    const p = prefetch(10_000);
    p.fetched(1, 1000, 1);
    p.fetched(1, 4000, 1);
    expect(p.free({ ...idle, held: 1, heldBytes: 0 })).toBe(2);
    p.fetched(1, 1000, 1);
    // 4000 * 0.8 + 1000 * 0.2 = 3400 bytes a row.
    expect(p.free({ ...idle, held: 1, heldBytes: 0 })).toBe(2);
    expect(p.free({ ...idle, held: 1, heldBytes: 3200 })).toBe(2);
    expect(p.free({ ...idle, held: 1, heldBytes: 3300 })).toBe(1);
  });
});

function prefetchWithRows(maxHeldBytes: number, rowBytes: number): Prefetch {
  const p = prefetch(maxHeldBytes);
  p.fetched(1, rowBytes, 1);
  return p;
}
