import type { Logger } from "pino";
import type { LoopName, WorkerEmitter } from "./events.js";

const RETRY_WARN_INTERVAL_MS = 30_000;

/**
 * What the worker says about its loops' failures and its deliveries' retries: an event for each, and log
 * lines throttled so an outage is visible at the default level without flooding the log.
 */
export class LoopHealth {
  readonly #failing = new Map<LoopName, number>();
  readonly #retryWarnings = new Map<string, { at: number; suppressed: number }>();

  constructor(
    private readonly log: Logger,
    private readonly emitter: WorkerEmitter,
  ) {}

  failed(loop: LoopName, error: Error, consecutive: number): void {
    this.#failing.set(loop, consecutive);
    this.emitter.emit("loop_error", { loop, error, consecutive });
    // First failure, then every 10th: an outage must not flood the log.
    if (consecutive === 1 || consecutive % 10 === 0) {
      // A right taken away while running: say which command gives the worker's rights back.
      const denied = (error as { code?: unknown }).code === "42501";
      this.log.warn(
        { loop, consecutive, err: error },
        denied
          ? `${loop} failed: the worker's role lacks a right; as the schema's owner, run \`outbox-worker grant --worker <role>\` with the role's options; backing off`
          : `${loop} failed; backing off`,
      );
    }
  }

  recovered(loop: LoopName): void {
    const n = this.#failing.get(loop);
    if (n) this.log.info({ loop, after: n }, `${loop} recovered`);
    this.#failing.delete(loop);
  }

  /** One warn line per queue per 30 s while its deliveries fail (each retry is a debug line). */
  retried(queue: string, id: string, error: string): void {
    const now = Date.now();
    const last = this.#retryWarnings.get(queue);
    if (last && now - last.at < RETRY_WARN_INTERVAL_MS) {
      last.suppressed++;
      return;
    }
    this.#retryWarnings.set(queue, { at: now, suppressed: 0 });
    this.log.warn(
      { queue, id, error, since: last ? { retries: last.suppressed, ms: now - last.at } : undefined },
      "deliveries failing; retrying with backoff (one line per queue every 30 s)",
    );
  }
}
