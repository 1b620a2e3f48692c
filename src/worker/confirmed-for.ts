/**
 * How long after a statement that leased or renewed a row was sent the worker may still count the row as
 * its own without asking again: the lease's life less a margin. The margin leaves a handler started at the
 * last moment time for the next renewal to land before the lease could run out; the renewals (every
 * `heartbeatMs`, at most half the TTL) keep a healthy worker's rows well inside it.
 */
export function confirmedForMs(options: { leaseTtlMs: number; queryTimeoutMs: number }): number {
  return options.leaseTtlMs - Math.min(options.queryTimeoutMs, Math.floor(options.leaseTtlMs / 4));
}
