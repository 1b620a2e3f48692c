import type { Logger } from "pino";

/** What a refused request was: a wrong token, or a Host/Origin the console does not answer. */
export interface RefusalEvent {
  /** The client's address (the socket's peer: behind a proxy, the proxy's). */
  client: string;
  kind: "token" | "host";
  method: string;
  path: string;
  status: number;
  error: string;
}

export interface RefusalLog {
  record(event: RefusalEvent): void;
  /** Report what is still suppressed and stop the timers. */
  close(): void;
}

/** Beyond this many clients in one window, the rest share one entry: a spray of addresses cannot grow memory. */
const MAX_CLIENTS = 1000;

interface Entry {
  suppressed: number;
  last: RefusalEvent;
  timer: NodeJS.Timeout;
}

/**
 * At most one line per client address and kind per window: the first refusal at once, then one line
 * per window with the count of those not logged, so someone guessing tokens cannot flood the log and an
 * operator still sees how many tries there were. Never the token: refusals carry only the reason.
 */
export function createRefusalLog(logger: Logger | undefined, windowMs = 60_000): RefusalLog {
  const entries = new Map<string, Entry>();
  const message = (kind: RefusalEvent["kind"]) =>
    kind === "token" ? "console refused a token" : "console refused a host";

  function flush(key: string): void {
    const entry = entries.get(key);
    if (!entry) return;
    if (entry.suppressed === 0) {
      entries.delete(key);
      return;
    }
    logger?.warn(
      { ...entry.last, suppressed: entry.suppressed, windowMs },
      `${message(entry.last.kind)} (${entry.suppressed} more from this client in the last ${Math.round(windowMs / 1000)} s)`,
    );
    entry.suppressed = 0;
    entry.timer = setTimeout(() => flush(key), windowMs).unref();
  }

  return {
    record(event) {
      const key =
        entries.size >= MAX_CLIENTS && !entries.has(`${event.kind} ${event.client}`)
          ? `${event.kind} (other clients)`
          : `${event.kind} ${event.client}`;
      const entry = entries.get(key);
      if (entry) {
        entry.suppressed++;
        entry.last = event;
        return;
      }
      logger?.warn({ ...event, suppressed: 0 }, message(event.kind));
      entries.set(key, { suppressed: 0, last: event, timer: setTimeout(() => flush(key), windowMs).unref() });
    },
    close() {
      for (const [key, entry] of [...entries]) {
        clearTimeout(entry.timer);
        if (entry.suppressed > 0) flush(key);
        const left = entries.get(key);
        if (left) clearTimeout(left.timer);
        entries.delete(key);
      }
    },
  };
}
