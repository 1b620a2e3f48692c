import { randomUUID } from "node:crypto";
import pg from "pg";
import pgListen, { type PgParsedNotification, type Subscriber } from "pg-listen";
import { OutboxError } from "../contract/errors.js";
import { runQuery } from "../sql/executor.js";
import { notifyStatement } from "../sql/probes.js";

/**
 * The worker's LISTEN connection: `listening` wakes it at once on new messages; while `reconnecting`, or in
 * `poll_only` (e.g. behind a transaction-mode PgBouncer), it finds them by polling.
 *
 *   from                                 event                                            to
 *   connecting, reconnecting             LISTEN done and the self-test notification came  listening
 *   connecting, reconnecting, listening  the self-test notification never came (a pooler) poll_only
 *   poll_only                            a later self-test (after a probe) came through   listening
 *   connecting, listening, poll_only     connection lost, probe failed, pg-listen gave up reconnecting
 *   reconnecting                         another reconnect attempt                        reconnecting
 *   any                                  stop()                                           stopped (final)
 *
 * Every change goes through `#setState`, which refuses any other transition.
 */
export type ListenerState = "connecting" | "listening" | "reconnecting" | "poll_only" | "stopped";

const TRANSITIONS: Readonly<Record<ListenerState, readonly ListenerState[]>> = {
  connecting: ["listening", "poll_only", "reconnecting", "stopped"],
  listening: ["poll_only", "reconnecting", "stopped"],
  poll_only: ["listening", "reconnecting", "stopped"],
  reconnecting: ["listening", "poll_only", "stopped"],
  stopped: [],
};

export interface NotifierOptions {
  /** Its own dedicated connection, never one from the worker pool. */
  connectionString: string;
  channel: string;
  /** Notifications whose payload is not a served queue are ignored. */
  queues: ReadonlySet<string> | "all";
  /** Called for each relevant notification; the payload is the queue name, not JSON. */
  onWake: (queue: string) => void;
  /** LISTEN was re-established: notifications sent in the gap are lost, so fetch at once. */
  onReconnected: () => void;
  onStateChange?: (state: ListenerState, detail?: string) => void;
  /** For logging only; background work never throws. */
  onError?: (error: Error) => void;
  /** Health probe period on the listener connection; a failed or timed-out probe forces a reconnect. */
  probeIntervalMs?: number;
  probeTimeoutMs?: number;
  /** How long the post-connect self-test waits for its own notification before switching to "poll_only". */
  selfTestTimeoutMs?: number;
  applicationName?: string;
  /**
   * Test seam: send the self-test NOTIFY to this channel instead of `channel`. Pointing it at a channel
   * nobody listens on simulates a pooler that accepts LISTEN but never delivers.
   */
  selfTestChannel?: string;
}

export interface Notifier {
  /**
   * Resolves once the first attempt has settled: "listening", "poll_only", or "reconnecting" when the
   * database is unreachable (retries then continue in the background). Never rejects.
   */
  start(): Promise<void>;
  /** Idempotent; resolves within a bounded time even when the database is unreachable. */
  stop(): Promise<void>;
  readonly state: ListenerState;
}

/** Self-test payloads start with this; queue names start with a letter or digit, so none collide. */
export const SELF_TEST_PAYLOAD_PREFIX = "#probe:";

const DEFAULT_PROBE_INTERVAL_MS = 30_000;
const DEFAULT_PROBE_TIMEOUT_MS = 5_000;
const DEFAULT_SELF_TEST_TIMEOUT_MS = 2_000;
const DEFAULT_APPLICATION_NAME = "outbox-notifier";
const CONNECT_TIMEOUT_MS = 10_000;
const CLOSE_TIMEOUT_MS = 3_000;
const RETRY_BASE_MS = 250;
const RETRY_MAX_MS = 5_000;
const RETEST_MAX_MS = 10 * 60_000;

type SelfTestOutcome = "delivered" | "lost" | "inconclusive";

/** One pg-listen subscriber. A retired generation is never reused; a replacement is spawned instead. */
interface Generation {
  readonly subscriber: Subscriber;
  retired: boolean;
  /** Initial LISTEN done: from now on a "connected" event means pg-listen reconnected by itself. */
  established: boolean;
  /** Bumped on each pg-listen reconnect attempt: a self-test that spans one proves nothing. */
  reconnects: number;
  verifying: boolean;
  /** The last self-test could not send its NOTIFY: retry it at the next probe. */
  selfTestPending: boolean;
  retestDelayMs: number;
  retestAt: number;
  probeTimer: NodeJS.Timeout | undefined;
  readonly selfTests: Map<string, () => void>;
  /** Run at retirement: aborts self-tests and closes their side connections. */
  readonly cleanups: Set<() => void>;
}

export function createNotifier(opts: NotifierOptions): Notifier {
  return new ListenNotifier(opts);
}

class ListenNotifier implements Notifier {
  readonly #opts: NotifierOptions;
  readonly #probeIntervalMs: number;
  readonly #probeTimeoutMs: number;
  readonly #selfTestTimeoutMs: number;
  readonly #applicationName: string;
  // A channel nobody listens on: the health probe is a NOTIFY there, a round trip without wake-ups.
  readonly #probeChannel: string;
  #state: ListenerState = "connecting";
  #settled: "listening" | "poll_only" | undefined;
  #current: Generation | undefined;
  #retryTimer: NodeJS.Timeout | undefined;
  #retryAttempt = 0;
  #started: Promise<void> | undefined;
  #stopping: Promise<void> | undefined;

  constructor(opts: NotifierOptions) {
    this.#opts = opts;
    this.#probeIntervalMs = opts.probeIntervalMs ?? DEFAULT_PROBE_INTERVAL_MS;
    this.#probeTimeoutMs = opts.probeTimeoutMs ?? DEFAULT_PROBE_TIMEOUT_MS;
    this.#selfTestTimeoutMs = opts.selfTestTimeoutMs ?? DEFAULT_SELF_TEST_TIMEOUT_MS;
    this.#applicationName = opts.applicationName ?? DEFAULT_APPLICATION_NAME;
    this.#probeChannel = `${opts.channel.slice(0, 50)}:probe`;
  }

  get state(): ListenerState {
    return this.#state;
  }

  start(): Promise<void> {
    if (this.#stopping) return Promise.resolve();
    this.#started ??= (async () => {
      this.#safely(() => this.#opts.onStateChange?.("connecting"));
      await this.#establish(false);
    })();
    return this.#started;
  }

  stop(): Promise<void> {
    this.#stopping ??= this.#shutdown();
    return this.#stopping;
  }

  async #shutdown(): Promise<void> {
    clearTimeout(this.#retryTimer);
    this.#setState("stopped");
    const gen = this.#current;
    this.#current = undefined;
    if (gen) await this.#retire(gen);
  }

  async #establish(reconnected: boolean): Promise<void> {
    if (this.#stopping) return;
    const gen = this.#spawn();
    this.#current = gen;
    try {
      await gen.subscriber.connect();
      await withTimeout(gen.subscriber.listenTo(this.#opts.channel), this.#probeTimeoutMs, "LISTEN");
    } catch (error) {
      this.#fail(gen, "connecting the LISTEN connection failed", error);
      return;
    }
    if (gen.retired) return;
    gen.established = true;
    await this.#verify(gen, reconnected);
  }

  #spawn(): Generation {
    const abortIfRetired = (): void => {
      // pg-listen's reconnect loop has no cancel: close() only stops it from *starting*. Throwing from
      // its retryInterval / "reconnect" callbacks is the one way to end a loop already running.
      if (gen.retired) throw new OutboxError("notifier: subscriber retired");
    };
    const gen: Generation = {
      subscriber: pgListen.default(
        {
          connectionString: this.#opts.connectionString,
          application_name: this.#applicationName,
          // Bounds each connect attempt; pg's default is to wait for the OS TCP timeout.
          connectionTimeoutMillis: CONNECT_TIMEOUT_MS,
        },
        {
          // Its default of 3 s gives up for good after a short outage (and only says so in one "error").
          retryTimeout: Number.POSITIVE_INFINITY,
          retryInterval: (attempt) => {
            abortIfRetired();
            return backoffMs(attempt);
          },
          // Its check runs a query without a timeout, so a black-holed socket hangs it forever: we probe.
          paranoidChecking: false,
          parse: (payload) => payload,
        },
      ),
      retired: false,
      established: false,
      reconnects: 0,
      verifying: false,
      selfTestPending: false,
      retestDelayMs: 0,
      retestAt: 0,
      probeTimer: undefined,
      selfTests: new Map(),
      cleanups: new Set(),
    };
    const events = gen.subscriber.events;
    // Always attached: an "error" event without a listener kills the process.
    events.on("error", (error) => this.#onSubscriberError(gen, error));
    events.on("reconnect", (attempt) => {
      abortIfRetired();
      gen.reconnects++;
      if (gen === this.#current)
        this.#setState("reconnecting", `connection lost; reconnect attempt ${attempt}`);
    });
    events.on("connected", () => {
      if (gen.retired) {
        // An attempt that was in flight when we retired it connected anyway: close what it opened.
        void gen.subscriber.close().catch(() => {});
      } else if (gen.established) {
        // pg-listen reconnected and re-ran LISTEN by itself.
        void this.#verify(gen, true).catch((error: unknown) => this.#report("self-test failed", error));
      }
    });
    events.on("notification", (notification) => this.#onNotification(gen, notification));
    return gen;
  }

  #onSubscriberError(gen: Generation, error: Error): void {
    if (gen.retired) {
      void gen.subscriber.close().catch(() => {});
      return;
    }
    // With parse = identity the only error pg-listen emits is its final one: it stopped reconnecting
    // and its subscriber is dead for good.
    this.#fail(gen, "the LISTEN connection gave up reconnecting", error);
  }

  #onNotification(gen: Generation, notification: PgParsedNotification): void {
    if (gen.retired || notification.channel !== this.#opts.channel) return;
    const payload: unknown = notification.payload;
    if (typeof payload !== "string" || payload.length === 0) return;
    if (payload.startsWith(SELF_TEST_PAYLOAD_PREFIX)) {
      gen.selfTests.get(payload)?.();
      return;
    }
    const queues = this.#opts.queues;
    if (queues !== "all" && !queues.has(payload)) return;
    this.#safely(() => this.#opts.onWake(payload));
  }

  async #verify(gen: Generation, reconnected: boolean): Promise<void> {
    const reconnects = gen.reconnects;
    gen.verifying = true;
    let outcome: SelfTestOutcome;
    try {
      outcome = await this.#selfTest(gen);
    } finally {
      gen.verifying = false;
    }
    // The reconnect's own "connected" event runs a fresh verify and settles the state.
    if (gen.retired || gen.reconnects !== reconnects) return;
    this.#retryAttempt = 0;
    gen.selfTestPending = outcome === "inconclusive";
    if (outcome === "lost") {
      gen.retestDelayMs = Math.min(RETEST_MAX_MS, Math.max(this.#probeIntervalMs, gen.retestDelayMs * 2));
      gen.retestAt = Date.now() + gen.retestDelayMs;
      if (this.#settled !== "poll_only") {
        this.#report(
          "self-test failed",
          new OutboxError(
            `LISTEN "${this.#opts.channel}" did not receive its own test notification within ${this.#selfTestTimeoutMs} ms; ` +
              "a transaction-mode pooler such as PgBouncer accepts LISTEN but never delivers. " +
              "Wake-ups are off: the worker relies on polling until a later self-test passes.",
          ),
        );
      }
      this.#settled = "poll_only";
      this.#setState("poll_only", "self-test notification not delivered");
    } else {
      gen.retestDelayMs = 0;
      this.#settled = "listening";
      this.#setState("listening");
    }
    this.#scheduleProbe(gen);
    if (reconnected) this.#safely(() => this.#opts.onReconnected());
  }

  /**
   * Sends a NOTIFY from a separate short-lived connection and waits for it on the listener. A NOTIFY on the
   * listener's own connection would prove nothing: Postgres delivers a session's notifications to itself,
   * and a transaction pooler may route it to the very backend that ran our LISTEN.
   */
  async #selfTest(gen: Generation): Promise<SelfTestOutcome> {
    const token = `${SELF_TEST_PAYLOAD_PREFIX}${randomUUID()}`;
    let settle: (delivered: boolean) => void = () => {};
    const arrival = new Promise<boolean>((resolve) => {
      settle = resolve;
    });
    const abort = (): void => settle(false);
    gen.selfTests.set(token, () => settle(true));
    gen.cleanups.add(abort);
    try {
      try {
        await this.#sendSelfTest(gen, token);
      } catch (error) {
        this.#report("self-test could not send its NOTIFY; retrying at the next probe", error);
        return "inconclusive";
      }
      const timer = setTimeout(abort, this.#selfTestTimeoutMs);
      const delivered = await arrival;
      clearTimeout(timer);
      return delivered ? "delivered" : "lost";
    } finally {
      gen.selfTests.delete(token);
      gen.cleanups.delete(abort);
    }
  }

  async #sendSelfTest(gen: Generation, token: string): Promise<void> {
    const client = new pg.Client({
      connectionString: this.#opts.connectionString,
      application_name: `${this.#applicationName}-selftest`,
      connectionTimeoutMillis: CONNECT_TIMEOUT_MS,
    });
    // An "error" event on a client without a listener kills the process; failures surface via the promises.
    client.on("error", () => {});
    const release = (): void => void client.end().catch(() => {});
    gen.cleanups.add(release);
    try {
      await client.connect();
      await withTimeout(
        runQuery(client, notifyStatement, {
          channel: this.#opts.selfTestChannel ?? this.#opts.channel,
          payload: token,
        }),
        this.#probeTimeoutMs,
        "self-test NOTIFY",
      );
    } finally {
      gen.cleanups.delete(release);
      release();
    }
  }

  #scheduleProbe(gen: Generation): void {
    clearTimeout(gen.probeTimer);
    if (gen.retired) return;
    gen.probeTimer = setTimeout(() => {
      gen.probeTimer = undefined;
      void this.#probe(gen).catch((error: unknown) => this.#report("health probe failed", error));
    }, this.#probeIntervalMs);
    gen.probeTimer.unref();
  }

  async #probe(gen: Generation): Promise<void> {
    if (gen.retired) return;
    try {
      // Under a timeout: on a black-holed socket the query never settles and the connection looks alive.
      await withTimeout(gen.subscriber.notify(this.#probeChannel), this.#probeTimeoutMs, "health probe");
    } catch (error) {
      this.#fail(gen, "health probe on the LISTEN connection failed; reconnecting", error);
      return;
    }
    if (gen.retired) return;
    const retest = this.#state === "poll_only" && Date.now() >= gen.retestAt;
    if ((gen.selfTestPending || retest) && !gen.verifying) await this.#verify(gen, false);
    else this.#scheduleProbe(gen);
  }

  /** Replaces a broken generation with a fresh one after a backoff. */
  #fail(gen: Generation, what: string, error: unknown): void {
    if (gen.retired || gen !== this.#current || this.#stopping) return;
    this.#report(what, error);
    void this.#retire(gen);
    this.#setState("reconnecting", `${what}: ${errorOf(error).message}`);
    clearTimeout(this.#retryTimer);
    this.#retryTimer = setTimeout(
      () => {
        this.#retryTimer = undefined;
        void this.#establish(true).catch((err: unknown) => this.#report("reconnecting failed", err));
      },
      backoffMs(this.#retryAttempt++),
    );
    this.#retryTimer.unref();
  }

  #retire(gen: Generation): Promise<void> {
    gen.retired = true;
    clearTimeout(gen.probeTimer);
    for (const cleanup of gen.cleanups) cleanup();
    gen.cleanups.clear();
    // end() waits for the server's goodbye, which an unreachable server never sends: bounded.
    return withTimeout(
      Promise.resolve().then(() => gen.subscriber.close()),
      CLOSE_TIMEOUT_MS,
      "closing the LISTEN connection",
    ).catch(() => {});
  }

  #setState(state: ListenerState, detail?: string): void {
    if (this.#state === state) return;
    if (!TRANSITIONS[this.#state].includes(state)) {
      // After stop() late events change nothing; anything else would be a bug in the table or the caller.
      if (this.#state !== "stopped")
        this.#report("state", new OutboxError(`no transition ${this.#state} → ${state}`));
      return;
    }
    this.#state = state;
    this.#safely(() => this.#opts.onStateChange?.(state, detail));
  }

  #report(what: string, error: unknown): void {
    if (this.#stopping) return;
    const cause = errorOf(error);
    const wrapped = new OutboxError(`notifier (${this.#opts.channel}): ${what}: ${cause.message}`, { cause });
    const onError = this.#opts.onError;
    if (onError) this.#safely(() => onError(wrapped), false);
  }

  /** User callbacks run inside pg's socket handlers: a throw there must not reach the driver. */
  #safely(fn: () => void, reportErrors = true): void {
    try {
      fn();
    } catch (error) {
      if (reportErrors) this.#report("callback threw", error);
    }
  }
}

function backoffMs(attempt: number): number {
  const ceiling = Math.min(RETRY_MAX_MS, RETRY_BASE_MS * 2 ** Math.min(attempt, 10));
  // Jitter: after a database restart, every worker must not reconnect in the same millisecond.
  return Math.round(ceiling * (0.5 + Math.random() * 0.5));
}

function withTimeout<T>(promise: Promise<T> | undefined, ms: number, what: string): Promise<T | undefined> {
  if (!promise) return Promise.resolve(undefined);
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new OutboxError(`${what} timed out after ${ms} ms`)), ms);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

function errorOf(error: unknown): Error {
  return error instanceof Error ? error : new Error(String(error));
}
