import type { ListenerState } from "../notify/notifier.js";

/**
 * The write that found the lease gone, in a `lease_lost` event; `start`: a queued row whose lease (or batch)
 * the worker could not confirm as still its own before starting its handler (it was frozen, or cut off).
 */
export type LeasePhase = "heartbeat" | "ack" | "retry" | "dead" | "release" | "start";
export type LoopName = "fetch" | "complete" | "heartbeat" | "release" | "listener";

/** Every event the worker emits. Outcome events fire only after their write has landed. */
export interface WorkerEvents {
  started: { workerId: string; queues: string[] };
  fetched: { count: number };
  dispatched: { id: string; queue: string; deliveries: number };
  acked: { id: string; queue: string; durationMs: number };
  /**
   * A queue's inbox held this message's (consumer, key): it was acked without running the handler (an
   * earlier delivery, or another message with the same derived key, was handled).
   */
  deduped: { id: string; queue: string; consumer: string; key: string };
  retried: {
    id: string;
    queue: string;
    delayMs: number;
    error: string;
    transient: boolean;
    /** The attempt ended because the handler ran past its timeout. */
    timedOut: boolean;
  };
  dead_lettered: { id: string; queue: string; reason: string; error: string | null };
  /** `deliveries` tells which delivery of the row lost its lease (the same worker may hold a newer one). */
  lease_lost: { id: string; queue: string; deliveries: number; phase: LeasePhase };
  /** `stillRunning`: timed-out handlers that ignored their signal and have not returned yet. */
  handler_timeout: { id: string; queue: string; timeoutMs: number; stillRunning: number };
  released: { count: number };
  /**
   * After the database restarted: rows left under this worker's own leases that it no longer holds (the
   * crash undid their outcome writes) were made due at once, instead of after the lease TTL.
   */
  reclaimed: { count: number; queues: Record<string, number> };
  listener: { state: ListenerState; detail?: string };
  loop_error: { loop: LoopName; error: Error; consecutive: number };
  drain_timeout: { abandoned: string[] };
  /** The event loop was blocked this long (a synchronous handler?): no lease was renewed meanwhile. */
  event_loop_blocked: { blockedMs: number };
  fatal: { error: Error };
  stopped: { drained: boolean };
}

/** The name of a {@link WorkerEvents} event, for `worker.on` and `worker.once`. */
export type WorkerEventName = keyof WorkerEvents;
type Listener<K extends WorkerEventName> = (event: WorkerEvents[K]) => void;

/** A typed emitter whose listeners can never break the worker: a throwing listener is reported, not rethrown. */
export class WorkerEmitter {
  readonly #listeners = new Map<WorkerEventName, Set<Listener<never>>>();

  constructor(private readonly onListenerError: (event: string, error: unknown) => void) {}

  on<K extends WorkerEventName>(event: K, listener: Listener<K>): () => void {
    let set = this.#listeners.get(event);
    if (!set) {
      set = new Set();
      this.#listeners.set(event, set);
    }
    set.add(listener as Listener<never>);
    return () => this.off(event, listener);
  }

  once<K extends WorkerEventName>(event: K, listener: Listener<K>): () => void {
    const off = this.on(event, (e) => {
      off();
      listener(e);
    });
    return off;
  }

  off<K extends WorkerEventName>(event: K, listener: Listener<K>): void {
    this.#listeners.get(event)?.delete(listener as Listener<never>);
  }

  hasListeners(event: WorkerEventName): boolean {
    return (this.#listeners.get(event)?.size ?? 0) > 0;
  }

  emit<K extends WorkerEventName>(event: K, payload: WorkerEvents[K]): void {
    const set = this.#listeners.get(event);
    if (!set) return;
    for (const listener of [...set]) {
      try {
        (listener as Listener<K>)(payload);
      } catch (error) {
        this.onListenerError(event, error);
      }
    }
  }
}
