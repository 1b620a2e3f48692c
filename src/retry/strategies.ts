import { OutboxConfigError } from "../contract/errors.js";
import { errorMessage } from "../contract/handler-errors.js";
import type { RetryContext, RetryDecision, RetryStrategy } from "../contract/retry.js";

export type { RetryContext, RetryDecision, RetryStrategy };

export interface ExponentialOptions {
  /** Delay after the first attempt, before jitter. Default 1000. */
  baseMs?: number;
  /** Growth per attempt, >= 1. Default 2. */
  factor?: number;
  /** Cap before jitter. Default 1 hour. */
  maxMs?: number;
  /** "equal" (default): half fixed, half random; "full": all random; "none": deterministic. */
  jitter?: "full" | "equal" | "none";
}

const HOUR_MS = 3_600_000;
const DEFAULT_MAX_DELAY_MS = 7 * 24 * HOUR_MS;

function requireMs(name: string, value: number): number {
  if (typeof value !== "number" || !Number.isFinite(value) || value < 0) {
    throw new OutboxConfigError(
      name,
      "a finite number >= 0",
      `${name} must be a finite number >= 0, got ${String(value)}`,
    );
  }
  return value;
}

/** A random number in [0, 1]; a broken source counts as 0 rather than poisoning the delay. */
function unit(random: () => number): number {
  const r = random();
  return r >= 0 && r <= 1 ? r : 0;
}

/** In [d/2, d]; the min() guards against rounding past d with tiny (subnormal) delays. */
function equalJitter(d: number, random: () => number): number {
  return Math.min(d, d / 2 + (unit(random) * d) / 2);
}

/** min(maxMs, baseMs * factor^exponent) for factor >= 1, finite for any exponent, including Infinity. */
function cappedExponential(baseMs: number, factor: number, exponent: number, maxMs: number): number {
  // factor ** exponent overflows to Infinity for large attempt counts (capped by min() below), and
  // 0 * Infinity or 1 ** Infinity would be NaN, so those cases return before the power is taken.
  if (baseMs === 0 || maxMs === 0) return 0;
  if (factor === 1 || !(exponent > 0)) return Math.min(baseMs, maxMs);
  return Math.min(maxMs, baseMs * factor ** exponent);
}

/** Attempts as a usable count: anything below 1 (or NaN) is treated as the first attempt. */
function atLeastOne(attempts: number): number {
  return Number.isNaN(attempts) ? 1 : Math.max(attempts, 1);
}

/**
 * Delay `baseMs * factor^(attempts-1)`, capped at `maxMs`, with jitter: the default strategy (1 s, ×2, at
 * most 1 hour, equal jitter). `random` is for tests.
 */
export function exponential(
  opts: ExponentialOptions = {},
  random: () => number = Math.random,
): RetryStrategy {
  return exponentialDelay(opts, random);
}

function exponentialDelay(opts: ExponentialOptions, random: () => number): (ctx: RetryContext) => number {
  const baseMs = requireMs("baseMs", opts.baseMs ?? 1000);
  const maxMs = requireMs("maxMs", opts.maxMs ?? HOUR_MS);
  const factor = opts.factor ?? 2;
  if (typeof factor !== "number" || !Number.isFinite(factor) || factor < 1) {
    throw new OutboxConfigError(
      "factor",
      "a finite number >= 1",
      `factor must be a finite number >= 1, got ${String(factor)}`,
    );
  }
  const jitter = opts.jitter ?? "equal";
  if (jitter !== "full" && jitter !== "equal" && jitter !== "none") {
    throw new OutboxConfigError(
      "jitter",
      '"full", "equal" or "none"',
      `jitter must be "full", "equal" or "none", got ${String(jitter)}`,
    );
  }
  return (ctx) => {
    const d = cappedExponential(baseMs, factor, atLeastOne(ctx.attempts) - 1, maxMs);
    if (jitter === "none") return d;
    if (jitter === "full") return unit(random) * d;
    return equalJitter(d, random);
  };
}

/** stepMs * attempts, capped at maxMs (default 1 hour). */
export function linear(opts: { stepMs?: number; maxMs?: number } = {}): RetryStrategy {
  const stepMs = requireMs("stepMs", opts.stepMs ?? 1000);
  const maxMs = requireMs("maxMs", opts.maxMs ?? HOUR_MS);
  // stepMs 0 would make 0 * Infinity = NaN.
  return (ctx) => (stepMs === 0 ? 0 : Math.min(maxMs, stepMs * atLeastOne(ctx.attempts)));
}

/** The same delay after every failure. */
export function constant(delayMs: number): RetryStrategy {
  const ms = requireMs("delayMs", delayMs);
  return () => ms;
}

/** Retry at once. */
export function none(): RetryStrategy {
  return () => 0;
}

const defaultDelay = exponentialDelay({}, Math.random);

export const defaultRetry: RetryStrategy = defaultDelay;

/**
 * `strategy`'s delays (the default backoff unless given) until `maxElapsedMs` have passed since the first
 * attempt, then "stop": the message is dead-lettered (`retries_exhausted`) even when its failures are
 * transient. Bounds how long an outage of a destination may hold a message. The first attempt's time is the
 * server's; `now` (the worker's clock, for tests) is compared with it, so clock skew shifts the bound.
 */
export function giveUpAfter(
  maxElapsedMs: number,
  strategy: RetryStrategy = defaultRetry,
  now: () => number = Date.now,
): RetryStrategy {
  const limit = requireMs("maxElapsedMs", maxElapsedMs);
  return (ctx) => {
    const first = ctx.firstAttemptAt instanceof Date ? ctx.firstAttemptAt.getTime() : Number.NaN;
    // A first attempt time that is not a finite date (none yet, or an odd row) bounds nothing: keep retrying.
    if (Number.isFinite(first) && now() - first >= limit) return "stop";
    return strategy(ctx);
  };
}

/**
 * Runs a (possibly user-supplied) strategy and normalises its answer to "stop" or whole ms in
 * [0, maxDelayMs]. A strategy that throws or returns garbage gets the default strategy's delay instead,
 * with the reason in `problem` for the caller to log: a message must never be lost or spun on a bad value.
 */
export function decide(
  strategy: RetryStrategy,
  ctx: RetryContext,
  maxDelayMs: number = DEFAULT_MAX_DELAY_MS,
): { decision: RetryDecision; problem?: string } {
  let cap = maxDelayMs;
  let capProblem: string | undefined;
  if (typeof cap !== "number" || !Number.isFinite(cap) || cap < 0) {
    capProblem = `invalid maxDelayMs ${String(maxDelayMs)}; used ${DEFAULT_MAX_DELAY_MS}`;
    cap = DEFAULT_MAX_DELAY_MS;
  }
  const clamp = (ms: number) => Math.min(Math.floor(cap), Math.max(0, Math.round(ms)));
  const fallback = (problem: string) => ({
    decision: clamp(defaultDelay(ctx)),
    problem: capProblem ? `${capProblem}; ${problem}` : problem,
  });

  let raw: unknown;
  try {
    raw = strategy(ctx);
  } catch (error) {
    return fallback(`retry strategy threw (${errorMessage(error, 500)}); used the default backoff`);
  }
  if (raw === "stop") return capProblem ? { decision: "stop", problem: capProblem } : { decision: "stop" };
  if (typeof raw === "number" && Number.isFinite(raw) && raw >= 0) {
    const decision = clamp(raw);
    return capProblem ? { decision, problem: capProblem } : { decision };
  }
  if (raw instanceof Promise) {
    // An async strategy's promise would otherwise reject unobserved and could crash the process.
    raw.catch(() => {});
    return fallback(
      "retry strategy returned a Promise (strategies must be synchronous); used the default backoff",
    );
  }
  return fallback(`retry strategy returned ${describe(raw)}; used the default backoff`);
}

function describe(value: unknown): string {
  if (typeof value === "string") return JSON.stringify(value.length > 50 ? `${value.slice(0, 50)}…` : value);
  if (typeof value === "number") return String(value);
  if (value === null) return "null";
  return `a value of type ${typeof value}`;
}

/**
 * Delay before retrying a failed worker loop (fetch, complete, listen): capped exponential with equal
 * jitter, so attempt 1 waits between baseMs/2 and baseMs, and no attempt waits longer than maxMs.
 */
export function backoffDelay(
  attempt: number,
  opts: { baseMs: number; maxMs: number; random?: () => number },
): number {
  const baseMs = requireMs("baseMs", opts.baseMs);
  const maxMs = requireMs("maxMs", opts.maxMs);
  const d = cappedExponential(baseMs, 2, atLeastOne(attempt) - 1, maxMs);
  return equalJitter(d, opts.random ?? Math.random);
}

/**
 * The least time a run of `failures` failed loop attempts in a row can span when each waits its
 * {@link backoffDelay} after the one before: the sum of the shortest waits (half of each capped delay).
 * 30 failures at the defaults (100 ms doubling to 10 s): 116,350 ms.
 */
export function loopGiveUpMs(failures: number, opts: { baseMs: number; maxMs: number }): number {
  const baseMs = requireMs("baseMs", opts.baseMs);
  const maxMs = requireMs("maxMs", opts.maxMs);
  let total = 0;
  for (let attempt = 1; attempt < failures; attempt++) {
    const d = cappedExponential(baseMs, 2, attempt - 1, maxMs);
    // Capped from here on: the rest is a product (maxConsecutiveFailures may be a million).
    if (d >= maxMs) return total + (failures - attempt) * (maxMs / 2);
    total += d / 2;
  }
  return total;
}
