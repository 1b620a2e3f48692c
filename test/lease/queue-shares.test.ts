import { describe, expect, it } from "vitest";
import { QueueShares } from "../../src/lease/queue-shares.js";

/**
 * One fetch as the lease statement makes it, over `due` rows per queue (in queue order): each queue's
 * oldest rows up to its share, its k-th at turn k / share, the first `limit` turns taken. → rows per queue.
 */
function cut(limit: number, shares: number[], due: number[]): number[] {
  const turns = shares.flatMap((share, q) =>
    Array.from({ length: Math.min(due[q] ?? 0, share) }, (_, k) => ({ q, turn: (k + 1) / share })),
  );
  turns.sort((x, y) => x.turn - y.turn || x.q - y.q);
  const taken = shares.map(() => 0);
  for (const t of turns.slice(0, limit)) taken[t.q] = (taken[t.q] ?? 0) + 1;
  return taken;
}

/** Fetch `limit` over `due` rows per queue; → the rows taken, whether more wait, and the next split. */
function fetchOnce(s: QueueShares, limit: number, due: number[]) {
  const split = s.split(limit);
  const taken = cut(limit, split, due);
  const more = s.record(limit, split, new Map(s.queues.map((q, i) => [q, taken[i] ?? 0])));
  return { split, taken, more, next: s.split(limit) };
}

describe("QueueShares: one fetch's limit split between a worker's queues", () => {
  it("one queue takes the whole limit", () => {
    const s = new QueueShares(["a"]);
    expect(s.split(500)).toEqual([500]);
    expect(fetchOnce(s, 500, [10_000]).next).toEqual([500]);
  });

  it("nothing known yet: each queue may take the whole limit, and the cut takes the same fraction of each", () => {
    const s = new QueueShares(["a", "b", "c"]);
    const first = fetchOnce(s, 500, [10_000, 10_000, 10_000]);
    expect(first.split).toEqual([500, 500, 500]);
    expect(first.taken).toEqual([167, 167, 166]);
    expect(first.more).toBe(true);
    expect(first.next, "all three were cut: they split the limit").toEqual([167, 167, 167]);
    expect(fetchOnce(s, 500, [10_000, 10_000, 10_000]).taken).toEqual([167, 167, 166]);
  });

  it("gives the whole limit to the one queue with a backlog; the quiet ones keep a floor", () => {
    const s = new QueueShares(["a", "b", "c"]);
    fetchOnce(s, 500, [10_000, 0, 0]);
    const { taken, more, next } = fetchOnce(s, 500, [10_000, 0, 0]);
    expect(taken).toEqual([500, 0, 0]);
    expect(more).toBe(true);
    expect(next).toEqual([500, 42, 42]);
  });

  it("a quiet queue's new rows are taken beside a backlog, and make it busy when they fill its floor", () => {
    const s = new QueueShares(["a", "b", "c"]);
    fetchOnce(s, 500, [10_000, 0, 0]);
    expect(fetchOnce(s, 500, [10_000, 5, 0]).taken).toEqual([495, 5, 0]);
    const burst = fetchOnce(s, 500, [10_000, 10_000, 0]);
    expect(burst.split).toEqual([500, 42, 42]);
    expect(burst.taken).toEqual([462, 38, 0]);
    expect(burst.next, "b reached the cut: busy").toEqual([250, 250, 42]);
  });

  it("a quiet queue gets twice what it returned", () => {
    const s = new QueueShares(["a", "b", "c"]);
    fetchOnce(s, 500, [10_000, 10_000, 0]);
    expect(fetchOnce(s, 500, [10_000, 10_000, 30]).next).toEqual([250, 250, 60]);
  });

  it("when every queue ran out nothing more waits and nothing is shared", () => {
    const s = new QueueShares(["a", "b", "c"]);
    const { more, next } = fetchOnce(s, 500, [100, 0, 7]);
    expect(more).toBe(false);
    expect(next).toEqual([500, 500, 500]);
  });
});
