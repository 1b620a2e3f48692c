/**
 * How one fetch's limit is split between the queues a worker serves. Each queue's scan stops at its share:
 * asking every queue for the whole limit read and locked up to limit × queues rows to lease `limit` (three
 * busy queues drained at 0.89× one queue; with shares, about 1×: bench/topics.ts).
 *
 * - A queue that was cut short last time (it filled its share, or the fetch was full and it still had rows
 *   when the cut came) is busy: the busy queues split the whole limit, so one queue's backlog still fills
 *   the batch.
 * - A queue that ran out is quiet: twice what it returned, at least a small floor (a quarter of an equal
 *   split), so its new rows are still taken at once and a burst makes it busy next time.
 * - With no queue busy (or nothing known yet) there is nothing to share: each may take the whole limit.
 *
 * Where the shares sum past the limit, the statement gives each queue the same fraction of its share (its
 * k-th row takes turn k / share), oldest first within each queue: a backlog cannot starve another queue.
 */
export class QueueShares {
  /** Per queue (in `queues` order): whether it was cut short last time, and the rows it returned. */
  #last: { busy: boolean; count: number }[] | undefined;

  constructor(readonly queues: readonly string[]) {}

  /** The share of each queue (in `queues` order) for a fetch of `limit` rows. */
  split(limit: number): number[] {
    const last = this.#last;
    const busy = last?.filter((q) => q.busy).length ?? 0;
    if (this.queues.length <= 1 || last === undefined || busy === 0) return this.queues.map(() => limit);
    const floor = Math.max(1, Math.ceil(limit / (4 * this.queues.length)));
    const busyShare = Math.ceil(limit / busy);
    return last.map((q) => (q.busy ? busyShare : Math.min(limit, Math.max(floor, 2 * q.count))));
  }

  /**
   * What a fetch of `limit` with `shares` returned, as rows per queue. True when some queue was cut short:
   * more of its rows may be waiting, even when the fetch returned fewer rows than its limit.
   */
  record(limit: number, shares: readonly number[], counts: ReadonlyMap<string, number>): boolean {
    const rows = this.queues.map((queue) => counts.get(queue) ?? 0);
    const total = rows.reduce((sum, n) => sum + n, 0);
    // A full fetch was cut at some turn: the queues that reached it (to within one row) had more.
    const cut =
      total >= limit ? Math.max(...rows.map((n, i) => n / (shares[i] ?? 1))) : Number.POSITIVE_INFINITY;
    this.#last = rows.map((count, i) => {
      const share = shares[i] ?? 0;
      return { busy: share > 0 && (count >= share || (count > 0 && (count + 1) / share >= cut)), count };
    });
    return this.#last.some((q) => q.busy);
  }
}
