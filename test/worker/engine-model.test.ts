import fc from "fast-check";
import pino from "pino";
import { describe, expect, it } from "vitest";
import type { MessageContext } from "../../src/contract/handler.js";
import { PermanentError, TransientError } from "../../src/contract/handler-errors.js";
import type { Delivery } from "../../src/lease/store.js";
import { createEngine, type Engine, type StopResult } from "../../src/worker/engine.js";
import { WorkerEmitter, type WorkerEventName } from "../../src/worker/events.js";
import { LoopHealth } from "../../src/worker/loop-health.js";
import { resolveWorkerOptions } from "../../src/worker/options.js";
import { MemoryLeaseStore, MemoryTable } from "../support/memory-store.js";
import { Journal, RecordingStore, type StoreCall, type StoreRecord } from "../support/recording-store.js";

/**
 * The whole delivery loop (fetcher → local queue → dispatcher → completer, with the heartbeat) on the
 * in-memory lease store, against a competing worker on the same table. Time on the table's clock stands
 * still (leases expire only when a test says so); the engine's own timers run on the real clock with
 * millisecond values, and every wait is for a condition, so a result never depends on how fast a run was.
 */

type HandlerOutcome = "resolve" | "error" | "permanent" | "transient" | "hang";
const QUEUES = ["q1", "q2"] as const;
/** The leases never run out by themselves: the table's clock only moves when a test moves it. */
const LEASE_TTL_MS = 1000;

interface RowSpec {
  queue: number;
  /** An ordering key (k0–k2), or none: keyed rows exercise per-key order and hand-offs. */
  key?: number | null;
  /** One per delivery of the row to this engine, in order; later ones resolve. */
  outcomes: HandlerOutcome[];
}

interface EngineSpec {
  rows: RowSpec[];
  queueCount: number;
  concurrency: number;
  batchSize: number;
  completionBatchSize: number;
  maxAttempts: number;
  handlerTimeoutMs?: number;
  /** Awaited by the handler before its outcome (holds a delivery in its handler). */
  gate?: (id: string) => Promise<void> | undefined;
}

interface Harness {
  clock: { now: number };
  table: MemoryTable;
  store: RecordingStore;
  competitor: MemoryLeaseStore;
  journal: Journal;
  engine: Engine;
  ids: string[];
  /** Handler calls per row id. */
  calls: Map<string, number>;
  /** Abort reasons seen by handlers, per row id. */
  aborts: Map<string, unknown[]>;
  /** Ids the competitor acknowledged. */
  competitorAcked: string[];
  fatal: Error[];
  /** Handler starts that came before an earlier row of their key had left the table. */
  orderViolations: string[];
  listenerErrors: unknown[];
}

const RECORDED: WorkerEventName[] = [
  "fetched",
  "dispatched",
  "acked",
  "retried",
  "dead_lettered",
  "lease_lost",
  "released",
  "drain_timeout",
  "handler_timeout",
];

function harness(spec: EngineSpec): Harness {
  const clock = { now: 0 };
  const table = new MemoryTable(() => clock.now);
  const queues = QUEUES.slice(0, spec.queueCount);
  const journal = new Journal();
  const store = new RecordingStore(
    new MemoryLeaseStore(table, { queues, leaseTtlMs: LEASE_TTL_MS, workerId: "engine" }),
    table,
    journal,
  );
  const competitor = new MemoryLeaseStore(table, {
    queues,
    leaseTtlMs: LEASE_TTL_MS,
    workerId: "competitor",
  });
  const outcomes = new Map<string, HandlerOutcome[]>();
  const ids = spec.rows.map((r) => {
    const id = table.insert(
      queues[r.queue % queues.length] as string,
      { n: 1 },
      {
        key: r.key === undefined || r.key === null ? null : `k${r.key}`,
      },
    );
    outcomes.set(id, r.outcomes);
    return id;
  });
  const calls = new Map<string, number>();
  const aborts = new Map<string, unknown[]>();
  const orderViolations: string[] = [];
  const handler = async (_payload: unknown, message: MessageContext): Promise<void> => {
    // Per-key order: a keyed row starts only once every earlier row of its key has left the table.
    for (const r of table.rows.values()) {
      if (
        r.queue === message.queue &&
        message.key !== null &&
        r.key === message.key &&
        Number(r.id) < Number(message.id)
      ) {
        orderViolations.push(`${message.id} (key ${message.key}) started while ${r.id} was still there`);
      }
    }
    const n = calls.get(message.id) ?? 0;
    calls.set(message.id, n + 1);
    const signal = message.signal;
    signal.addEventListener("abort", () => {
      aborts.set(message.id, [...(aborts.get(message.id) ?? []), signal.reason]);
    });
    await spec.gate?.(message.id);
    switch (outcomes.get(message.id)?.[n] ?? "resolve") {
      case "resolve":
        return;
      case "error":
        throw new Error("handler failed");
      case "permanent":
        throw new PermanentError("handler rejected the message");
      case "transient":
        throw new TransientError("handler says: later");
      case "hang":
        return new Promise<void>((_resolve, reject) => {
          if (signal.aborted) reject(signal.reason);
          signal.addEventListener("abort", () => reject(signal.reason), { once: true });
        });
    }
  };
  const options = resolveWorkerOptions({
    connection: "postgres://unused@localhost/x",
    queues: Object.fromEntries(
      queues.map((q) => [q, { handler, timeoutMs: spec.handlerTimeoutMs ?? 30 }] as const),
    ),
    workerId: "engine",
    logger: false,
    concurrency: spec.concurrency,
    batchSize: spec.batchSize,
    completionBatchSize: spec.completionBatchSize,
    completionWindowMs: 1,
    leaseTtlMs: LEASE_TTL_MS,
    heartbeatMs: 5,
    minPollIntervalMs: 1,
    maxPollIntervalMs: 5,
    loopBackoffBaseMs: 1,
    loopBackoffMaxMs: 5,
    maxConsecutiveFailures: 1000,
    maxAttempts: spec.maxAttempts,
    maxDeliveries: 6,
    retry: () => 0,
  });
  const log = pino({ level: "silent" });
  const listenerErrors: unknown[] = [];
  const emitter = new WorkerEmitter((_event, error) => listenerErrors.push(error));
  for (const name of RECORDED) emitter.on(name, (payload) => journal.event(name, payload));
  const fatal: Error[] = [];
  const engine = createEngine({
    options,
    store,
    log,
    emitter,
    health: new LoopHealth(log, emitter),
    onFatal: (error) => fatal.push(error),
  });
  return {
    clock,
    table,
    store,
    competitor,
    journal,
    engine,
    ids,
    calls,
    aborts,
    competitorAcked: [],
    fatal,
    orderViolations,
    listenerErrors,
  };
}

/** Poll `condition` every millisecond until it holds or `capMs` passed; true if it held. */
async function waitFor(condition: () => boolean, capMs: number): Promise<boolean> {
  const until = Date.now() + capMs;
  while (!condition()) {
    if (Date.now() > until) return false;
    await new Promise((resolve) => setTimeout(resolve, 1));
  }
  return true;
}

const key = (d: Delivery) => `${d.id}/${d.token}`;

/** `id#deliveries` of each of the engine's leases → its delivery key: how a lease_lost event names one. */
function engineDeliveries(records: StoreRecord[]): { byCount: Map<string, string>; problems: string[] } {
  const byCount = new Map<string, string>();
  const problems: string[] = [];
  for (const r of records) {
    if (r.call !== "lease" || !r.lease) continue;
    for (const row of r.lease.rows) {
      const k = `${row.id}#${row.deliveries}`;
      if (byCount.has(k)) problems.push(`two leases of row ${row.id} with delivery count ${row.deliveries}`);
      byCount.set(k, `${row.id}/${r.lease.token}`);
    }
  }
  return { byCount, problems };
}

/** Deliveries the engine reported lost (lease_lost), with the journal position of the report. */
function lostDeliveries(h: Harness): Map<string, number> {
  const { byCount } = engineDeliveries(h.journal.records);
  const lost = new Map<string, number>();
  for (const e of h.journal.events) {
    if (e.name !== "lease_lost") continue;
    const k = byCount.get(`${e.payload.id}#${e.payload.deliveries}`);
    if (k !== undefined && !lost.has(k)) lost.set(k, e.seq);
  }
  return lost;
}

const OUTCOME_EVENT: Partial<Record<StoreCall, string>> = {
  ack: "acked",
  retry: "retried",
  deadLetter: "dead_lettered",
};

/** Every invariant of the loop, as a list of violations (empty: all hold). */
function violations(h: Harness, result: StopResult): string[] {
  const { records, events } = h.journal;
  const { byCount, problems } = engineDeliveries(records);
  const engineTokens = h.store.tokens;

  problems.push(...h.orderViolations);

  // (b) No write landed under a token the row no longer carried.
  for (const r of records) {
    if (r.failed) continue;
    for (const d of r.deliveries) {
      if (d.landed && d.rowToken !== d.token) {
        problems.push(`${r.call} of ${key(d)} landed on a row whose token was ${d.rowToken}`);
      }
    }
  }

  // A lease the engine took back (reclaim) was one it no longer worked on: no outcome or renewal follows.
  const reclaimedAt = new Map<string, number>();
  for (const r of records) {
    if (r.call !== "reclaim") continue;
    for (const d of r.deliveries) if (!reclaimedAt.has(key(d))) reclaimedAt.set(key(d), r.seq);
  }
  for (const r of records) {
    if (r.failed || !["ack", "retry", "deadLetter", "renew"].includes(r.call)) continue;
    for (const d of r.deliveries) {
      const at = reclaimedAt.get(key(d));
      if (at !== undefined && at < r.seq)
        problems.push(`${r.call} of ${key(d)} after reclaim took its lease`);
    }
  }

  // lease_lost names each delivery once.
  const lostAt = new Map<string, number>();
  for (const e of events) {
    if (e.name !== "lease_lost") continue;
    const k = byCount.get(`${e.payload.id}#${e.payload.deliveries}`);
    if (k === undefined)
      problems.push(`lease_lost for a delivery the engine never leased: ${JSON.stringify(e)}`);
    else if (lostAt.has(k)) problems.push(`lease_lost twice for ${k}`);
    else lostAt.set(k, e.seq);
  }

  // Outcome events match the landed outcome writes one to one; a write that did not land is a lost lease.
  const landedIds: Record<string, string[]> = { acked: [], retried: [], dead_lettered: [] };
  const landedPerDelivery = new Map<string, number>();
  const notLandedOutcome = new Set<string>();
  const notLandedRenew = new Set<string>();
  let releasedLanded = 0;
  for (const r of records) {
    if (r.failed) continue;
    const event = OUTCOME_EVENT[r.call];
    for (const d of r.deliveries) {
      const k = key(d);
      if (event !== undefined) {
        const lost = lostAt.get(k);
        if (lost !== undefined && lost < r.seq)
          problems.push(`${r.call} written for ${k} after its lease_lost`);
        if (d.landed) {
          (landedIds[event] as string[]).push(d.id);
          landedPerDelivery.set(k, (landedPerDelivery.get(k) ?? 0) + 1);
        } else notLandedOutcome.add(k);
      } else if (r.call === "renew" && !d.landed) notLandedRenew.add(k);
      else if (r.call === "release" && d.landed) releasedLanded++;
    }
  }
  for (const [k, n] of landedPerDelivery) if (n > 1) problems.push(`${n} outcomes landed for ${k}`);
  const sorted = (xs: string[]) => [...xs].sort();
  for (const [event, ids] of Object.entries(landedIds)) {
    const reported = events.filter((e) => e.name === event).map((e) => String(e.payload.id));
    if (JSON.stringify(sorted(reported)) !== JSON.stringify(sorted(ids))) {
      problems.push(
        `${event} events ${JSON.stringify(sorted(reported))} ≠ landed writes ${JSON.stringify(sorted(ids))}`,
      );
    }
  }
  const abandoned = new Set(result.abandoned);
  for (const k of lostAt.keys()) {
    if (!notLandedOutcome.has(k) && !notLandedRenew.has(k))
      problems.push(`lease_lost for ${k}, whose writes all landed`);
  }
  for (const k of notLandedOutcome)
    if (!lostAt.has(k)) problems.push(`outcome write of ${k} missed, no lease_lost`);
  for (const k of notLandedRenew) {
    if (!lostAt.has(k) && !abandoned.has(k.split("/")[0] as string))
      problems.push(`renewal of ${k} missed, no lease_lost`);
  }

  // (c) Nothing held after the stop. (d) What the stop says it released is what landed.
  if (h.engine.held !== 0) problems.push(`engine still holds ${h.engine.held} deliveries after shutdown`);
  if (result.released !== releasedLanded)
    problems.push(`released ${result.released}, landed ${releasedLanded}`);
  const releasedEvents = events
    .filter((e) => e.name === "released")
    .reduce((n, e) => n + Number(e.payload.count), 0);
  if (releasedEvents !== releasedLanded)
    problems.push(`released events count ${releasedEvents}, landed ${releasedLanded}`);

  // (a) Every row ends exactly one way.
  const count = (xs: string[], id: string) => xs.filter((x) => x === id).length;
  for (const id of h.ids) {
    const acked = count(landedIds.acked as string[], id);
    const dead = count(landedIds.dead_lettered as string[], id);
    const competitor = count(h.competitorAcked, id);
    const row = h.table.rows.get(id);
    const ends = acked + dead + competitor + (row ? 1 : 0);
    if (ends !== 1)
      problems.push(`row ${id}: acked ${acked}, dead ${dead}, competitor ${competitor}, in table ${!!row}`);
    if (h.table.deadLetters.has(id) !== (dead === 1))
      problems.push(`row ${id}: dead letters disagree (${dead} landed)`);
    if (row && row.token !== null && !engineTokens.has(row.token))
      problems.push(`row ${id} left leased by someone else`);
  }
  for (const id of result.abandoned) {
    const token = h.table.rows.get(id)?.token;
    if (token === undefined || token === null || !engineTokens.has(token)) {
      problems.push(`abandoned row ${id} should keep this worker's lease until it expires (token ${token})`);
    }
  }
  if (h.fatal.length > 0) problems.push(`fatal: ${h.fatal.map(String).join(", ")}`);
  if (h.listenerErrors.length > 0)
    problems.push(`listener errors: ${h.listenerErrors.map(String).join(", ")}`);
  return problems;
}

/** A competing worker takes over some of the engine's rows once their leases ran out, then finishes them. */
async function takeover(
  h: Harness,
  picks: number[],
  finish: "ack" | "retry" | "release",
): Promise<string | undefined> {
  const mine = [...h.table.rows.values()].filter((r) => r.token !== null && h.store.tokens.has(r.token));
  if (mine.length === 0) return undefined;
  const chosen = [...new Set(picks.map((p) => mine[p % mine.length]))].filter((r) => r !== undefined);
  const engineKeys = chosen.map((r) => `${r.id}/${r.token}`);
  // The chosen leases ran out before this worker's heartbeat renewed them; the competitor takes each of
  // them, alone (a row whose lease ran out is never leased in a batch).
  for (const r of chosen) r.leaseExpiresAt = h.clock.now - 1;
  const wanted = new Set(chosen.map((r) => r.id));
  const taken: { id: string; token: string }[] = [];
  for (const _ of chosen) {
    const lease = await h.competitor.leaseAlone();
    for (const r of lease.rows) taken.push({ id: r.id, token: lease.token });
  }
  if (taken.some((d) => !wanted.has(d.id))) return "competitor took a row whose lease had not run out";
  if (taken.length !== chosen.length)
    return `competitor took ${taken.length} of ${chosen.length} expired rows`;
  // This worker must notice every takeover: a renewal or an outcome write finds the competitor's token.
  const noticed = await waitFor(() => {
    const lost = lostDeliveries(h);
    return engineKeys.every((k) => lost.has(k));
  }, 30_000);
  if (!noticed) {
    const lost = lostDeliveries(h);
    return `takeover of ${engineKeys.filter((k) => !lost.has(k)).join(", ")} never reported as lease_lost`;
  }
  const landed =
    finish === "ack"
      ? await h.competitor.ack(taken.map((d) => ({ held: d })))
      : finish === "retry"
        ? await h.competitor.retry(
            taken.map((d) => ({ held: d, delayMs: 0, error: "competitor failed", failed: 0 })),
          )
        : await h.competitor.release(taken);
  if (landed.count !== taken.length)
    return `competitor's ${finish} of ${taken.length} rows landed ${landed.count}`;
  if (finish === "ack") h.competitorAcked.push(...taken.map((d) => d.id));
  return undefined;
}

type Step =
  | { t: "wait"; events: number }
  | { t: "takeover"; picks: number[]; finish: "ack" | "retry" | "release" }
  | { t: "fail"; call: StoreCall; times: number }
  /** Take back stale leases, as after a database restart: there are none to take, held rows stay held. */
  | { t: "reclaim" };

interface Scenario extends EngineSpec {
  steps: Step[];
  /** Stop before step `at` (at ≥ steps: after the last); none: let every row finish, then stop. */
  stop: { at: number; timeoutMs: number } | null;
}

const outcomeEvents = (h: Harness) =>
  h.journal.events.filter((e) => ["acked", "retried", "dead_lettered", "lease_lost"].includes(e.name)).length;

async function runScenario(s: Scenario): Promise<{ h: Harness; result: StopResult; problems: string[] }> {
  const h = harness(s);
  h.engine.startDispatching();
  h.engine.startFetching();
  let result: StopResult | undefined;
  const problems: string[] = [];
  try {
    // The steps start once the engine is under way (a stop before the first fetch would test nothing).
    await waitFor(() => h.journal.events.some((e) => e.name === "dispatched"), 200);
    for (let i = 0; i <= s.steps.length && result === undefined; i++) {
      if (s.stop !== null && s.stop.at === i) {
        result = await h.engine.shutdown(s.stop.timeoutMs);
        break;
      }
      const step = s.steps[i];
      if (step === undefined) break;
      if (step.t === "wait") {
        const before = outcomeEvents(h);
        await waitFor(() => outcomeEvents(h) >= before + step.events || h.table.rows.size === 0, 50);
      } else if (step.t === "fail") {
        h.store.failNext(step.call, step.times);
      } else if (step.t === "reclaim") {
        await h.engine.reclaimStale();
      } else {
        const problem = await takeover(h, step.picks, step.finish);
        if (problem) problems.push(problem);
      }
    }
    if (result === undefined) {
      if (!(await waitFor(() => h.table.rows.size === 0, 30_000))) {
        problems.push(`rows never finished: ${JSON.stringify([...h.table.rows.values()])}`);
      }
      result = await h.engine.shutdown(1000);
      if (
        problems.length === 0 &&
        (!result.drained || result.released !== 0 || result.abandoned.length > 0)
      ) {
        problems.push(`a stop after everything finished should drain: ${JSON.stringify(result)}`);
      }
    }
  } finally {
    result ??= await h.engine.shutdown(0);
  }
  problems.push(...violations(h, result));
  // Whatever is left is leasable by another worker once this worker's leases run out: every row that is
  // not waiting behind an earlier row of its key (the worker never leaves a key without a head).
  h.clock.now += LEASE_TTL_MS + 1;
  const other = new MemoryLeaseStore(h.table, { queues: [...QUEUES], leaseTtlMs: LEASE_TTL_MS });
  // Those held through the stop's timeout alone, one by one; the others in a batch.
  const after = { rows: [] as { id: string }[] };
  for (let lone = await other.leaseAlone(); lone.rows.length > 0; lone = await other.leaseAlone())
    after.rows.push(...lone.rows);
  after.rows.push(...(await other.lease(10_000)).rows);
  const left = [...h.table.rows.values()];
  const due = left.filter(
    (r) =>
      r.key === null ||
      !left.some((e) => e.queue === r.queue && e.key === r.key && Number(e.id) < Number(r.id)),
  );
  if (after.rows.length !== due.length) {
    problems.push(`only ${after.rows.length} of the ${due.length} remaining due rows were leasable again`);
  }
  return { h, result, problems };
}

const outcome = fc.constantFrom<HandlerOutcome>("resolve", "error", "permanent", "transient", "hang");
const step: fc.Arbitrary<Step> = fc.oneof(
  {
    weight: 3,
    arbitrary: fc.record({ t: fc.constant("wait" as const), events: fc.integer({ min: 1, max: 5 }) }),
  },
  {
    weight: 3,
    arbitrary: fc.record({
      t: fc.constant("takeover" as const),
      picks: fc.array(fc.nat(), { minLength: 1, maxLength: 4 }),
      finish: fc.constantFrom("ack" as const, "retry" as const, "release" as const),
    }),
  },
  { weight: 1, arbitrary: fc.constant({ t: "reclaim" as const }) },
  {
    weight: 2,
    arbitrary: fc.record({
      t: fc.constant("fail" as const),
      call: fc.constantFrom<StoreCall>("lease", "ack", "retry", "deadLetter", "renew", "release"),
      times: fc.integer({ min: 1, max: 2 }),
    }),
  },
);
const scenario: fc.Arbitrary<Scenario> = fc.record({
  rows: fc.array(
    fc.record({
      queue: fc.nat(1),
      key: fc.option(fc.nat(2), { nil: null }),
      outcomes: fc.array(outcome, { maxLength: 3 }),
    }),
    {
      minLength: 1,
      maxLength: 40,
    },
  ),
  queueCount: fc.integer({ min: 1, max: 2 }),
  concurrency: fc.integer({ min: 1, max: 4 }),
  batchSize: fc.integer({ min: 1, max: 10 }),
  completionBatchSize: fc.integer({ min: 1, max: 10 }),
  maxAttempts: fc.integer({ min: 1, max: 3 }),
  steps: fc.array(step, { maxLength: 10 }),
  stop: fc.option(fc.record({ at: fc.nat(10), timeoutMs: fc.integer({ min: 0, max: 30 }) }), {
    nil: null,
    freq: 3,
  }),
});

describe("engine model (in-memory lease store, competing worker)", () => {
  it("every row ends acked, dead-lettered, or left leasable exactly once; no stale write lands; events match the writes", async () => {
    // What the runs exercised (ENGINE_MODEL_STATS=1 prints it): a property that never reaches a case proves nothing.
    const seen = new Map<string, number>();
    const saw = (what: string, n = 1) => seen.set(what, (seen.get(what) ?? 0) + n);
    await fc.assert(
      fc.asyncProperty(scenario, async (s) => {
        const { h, result, problems } = await runScenario(s);
        if (problems.length > 0) throw new Error(problems.join("\n"));
        saw("runs");
        if (s.stop !== null) saw("stopped early");
        if (!result.drained) saw("stop not drained");
        saw("released", result.released);
        saw("abandoned", result.abandoned.length);
        for (const e of h.journal.events)
          saw(`event ${e.name}${e.name === "lease_lost" ? ` (${e.payload.phase})` : ""}`);
        for (const r of h.journal.records) if (r.failed) saw(`injected ${r.call} failure`);
        for (const r of h.journal.records)
          if (r.call === "reclaim") saw("rows reclaimed", r.deliveries.length);
        saw("competitor acked", h.competitorAcked.length);
        saw("rows left in table", h.table.rows.size);
      }),
      {
        numRuns: Number(process.env.ENGINE_MODEL_RUNS ?? 60),
        // Found by this property: a stop whose hand-back of a queued row fails three times left the row held.
        examples: [
          [
            {
              rows: [
                { queue: 0, outcomes: ["hang"] },
                { queue: 0, outcomes: [] },
              ],
              queueCount: 1,
              concurrency: 1,
              batchSize: 1,
              completionBatchSize: 1,
              maxAttempts: 1,
              steps: [
                { t: "fail", call: "release", times: 1 },
                { t: "fail", call: "lease", times: 1 },
                { t: "fail", call: "lease", times: 1 },
                { t: "fail", call: "release", times: 2 },
              ],
              stop: { at: 4, timeoutMs: 0 },
            },
          ],
        ],
      },
    );
    if (process.env.ENGINE_MODEL_STATS) console.log(Object.fromEntries([...seen].sort()));
  }, 180_000);

  it("a hanging handler whose lease is taken over is aborted and reported lost, and its outcome is never written", async () => {
    const h = harness({
      rows: [
        { queue: 0, outcomes: ["hang"] },
        { queue: 0, outcomes: [] },
      ],
      queueCount: 1,
      concurrency: 1,
      batchSize: 1,
      completionBatchSize: 10,
      maxAttempts: 3,
      handlerTimeoutMs: 60_000,
    });
    h.engine.startDispatching();
    h.engine.startFetching();
    expect(await waitFor(() => h.calls.get("1") === 1, 30_000)).toBe(true);
    const first = h.table.rows.get("1");
    const stale = `1/${first?.token}`;
    expect(await takeover(h, [0], "ack")).toBeUndefined();
    expect(h.aborts.get("1")).toHaveLength(1);
    expect(String(h.aborts.get("1")?.[0])).toMatch(/lease lost/);
    const lost = h.journal.events.filter((e) => e.name === "lease_lost");
    expect(lost.map((e) => e.payload)).toEqual([{ id: "1", queue: "q1", deliveries: 1, phase: "heartbeat" }]);
    // The loop moves on to row 2 only after it dealt with row 1's outcome: by row 2's ack, a write for the
    // lost delivery would have been made.
    expect(
      await waitFor(() => h.journal.events.some((e) => e.name === "acked" && e.payload.id === "2"), 30_000),
    ).toBe(true);
    const result = await h.engine.shutdown(1000);
    expect(result).toEqual({ drained: true, released: 0, abandoned: [] });
    const writesForStale = h.journal.records.filter(
      (r) => r.call !== "renew" && r.deliveries.some((d) => key(d) === stale),
    );
    expect(writesForStale).toEqual([]);
    expect(h.competitorAcked).toEqual(["1"]);
    expect(violations(h, result)).toEqual([]);
  });

  /** `rows` rows, concurrency 1: row 1's handler waits for `open()`, so the rows fetched after it stay queued. */
  async function oneRunningRestQueued(rows: number) {
    let open!: () => void;
    const gate = new Promise<void>((resolve) => {
      open = resolve;
    });
    const h = harness({
      rows: Array.from({ length: rows }, () => ({ queue: 0, outcomes: [] as HandlerOutcome[] })),
      queueCount: 1,
      concurrency: 1,
      batchSize: rows,
      completionBatchSize: 10,
      maxAttempts: 3,
      handlerTimeoutMs: 60_000,
      gate: (id) => (id === "1" ? gate : undefined),
    });
    h.engine.startDispatching();
    h.engine.startFetching();
    expect(await waitFor(() => h.calls.get("1") === 1 && h.engine.held >= 2, 30_000)).toBe(true);
    return { h, open };
  }

  it("a stop hands back the queued rows: released, counted once, and leasable again by another worker", async () => {
    const { h, open } = await oneRunningRestQueued(6);
    // The gate opens once the hand-back landed: the running handler then finishes within the timeout.
    const stopping = h.engine.shutdown(5000);
    expect(await waitFor(() => h.journal.events.some((e) => e.name === "released"), 30_000)).toBe(true);
    open();
    const result = await stopping;
    expect(result.drained).toBe(true);
    expect(result.abandoned).toEqual([]);
    expect(result.released).toBeGreaterThanOrEqual(1);
    const released = h.journal.records.filter((r) => r.call === "release").flatMap((r) => r.deliveries);
    expect(released).toHaveLength(result.released);
    expect(released.every((d) => d.landed)).toBe(true);
    // Row 1 ran and was acknowledged; no row started twice; only the released ones were ever handed back.
    expect(h.calls.get("1")).toBe(1);
    for (const d of released) expect(h.calls.get(d.id)).toBeUndefined();
    expect(h.journal.events.filter((e) => e.name === "acked").map((e) => e.payload.id)).toEqual(["1"]);
    expect(h.engine.held).toBe(0);
    for (const d of released) expect(h.table.rows.get(d.id)).toMatchObject({ token: null, deliveries: 0 });
    expect(violations(h, result)).toEqual([]);
    // Another worker leases all five remaining rows at once, released ones included, as first deliveries.
    const other = await h.competitor.lease(10);
    expect(other.rows.map((r) => [r.id, r.deliveries_count])).toEqual(
      ["2", "3", "4", "5", "6"].map((id) => [id, 1]),
    );
  });

  it("a stop whose hand-back keeps failing holds no row afterwards; the rows' leases are left to expire", async () => {
    const { h, open } = await oneRunningRestQueued(3);
    h.store.failNext("release", 3); // every attempt of the hand-back fails
    const stopping = h.engine.shutdown(5000);
    expect(
      await waitFor(
        () => h.journal.records.filter((r) => r.call === "release" && r.failed).length === 3,
        30_000,
      ),
    ).toBe(true);
    open();
    const result = await stopping;
    expect(result.released).toBe(0);
    expect(h.engine.held).toBe(0);
    // Row 1 was acked; the others still carry this worker's lease until it expires, then anyone leases them.
    const kept = [...h.table.rows.values()].filter((r) => r.token !== null);
    expect(kept.length).toBeGreaterThanOrEqual(1);
    expect(kept.every((r) => r.token !== null && h.store.tokens.has(r.token))).toBe(true);
    expect(violations(h, result)).toEqual([]);
  });

  it("a failing ack write is retried and lands once the store works again, with one acked event per row", async () => {
    const h = harness({
      rows: [
        { queue: 0, outcomes: [] },
        { queue: 0, outcomes: [] },
        { queue: 0, outcomes: [] },
      ],
      queueCount: 1,
      concurrency: 2,
      batchSize: 3,
      completionBatchSize: 10,
      maxAttempts: 3,
    });
    h.store.failNext("ack", 3);
    h.engine.startDispatching();
    h.engine.startFetching();
    expect(await waitFor(() => h.table.rows.size === 0, 30_000)).toBe(true);
    const result = await h.engine.shutdown(1000);
    expect(result).toEqual({ drained: true, released: 0, abandoned: [] });
    const acks = h.journal.records.filter((r) => r.call === "ack");
    expect(acks.filter((r) => r.failed)).toHaveLength(3);
    expect(acks.filter((r) => !r.failed).flatMap((r) => r.deliveries.map((d) => [d.id, d.landed]))).toEqual(
      expect.arrayContaining([
        ["1", true],
        ["2", true],
        ["3", true],
      ]),
    );
    const acked = h.journal.events.filter((e) => e.name === "acked").map((e) => e.payload.id);
    expect([...acked].sort()).toEqual(["1", "2", "3"]);
    expect(h.journal.events.filter((e) => e.name === "lease_lost")).toEqual([]);
    expect(h.journal.events.filter((e) => e.name === "retried" || e.name === "dead_lettered")).toEqual([]);
    expect(violations(h, result)).toEqual([]);
  });
});
