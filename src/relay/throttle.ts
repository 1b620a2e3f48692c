/**
 * Runs `log` at most once per `intervalMs` for each key. A misconfigured target fails every message the
 * same way; one line now and then says so without flooding the log.
 */
export function throttledLog(intervalMs: number): (key: string, log: () => void) => void {
  const last = new Map<string, number>();
  return (key, log) => {
    const now = Date.now();
    const previous = last.get(key);
    if (previous !== undefined && now - previous < intervalMs) return;
    last.set(key, now);
    log();
  };
}
