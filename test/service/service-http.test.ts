import { createServer, type Socket } from "node:net";
import pg from "pg";
import pino from "pino";
import { collectDefaultMetrics, Registry } from "prom-client";
import { afterEach, beforeAll, describe, expect, it } from "vitest";
import { PermanentError, TransientError } from "../../src/contract/handler-errors.js";
import { replayDeadLetters } from "../../src/inspect/dead-letters.js";
import { migrate, migrationState } from "../../src/migrate/migrator.js";
import { constant } from "../../src/retry/strategies.js";
import { startHttpServer } from "../../src/service/http-server.js";
import { createMetrics, type Metrics, OTHER_TOPICS_LABEL } from "../../src/service/metrics.js";
import { createReadiness, type Readiness, type ReadinessReport } from "../../src/service/readiness.js";
import { outboxNames } from "../../src/sql/names.js";
import { subscribe, unsubscribe } from "../../src/subscribe/subscriptions.js";
import type { WorkerOptions } from "../../src/worker/options.js";
import { createWorker, type Worker } from "../../src/worker/worker.js";
import { testDatabase } from "../support/database.js";
import { nextEvent, publisherFor, until } from "../support/worker.js";

const db = testDatabase("svc");
const outbox = publisherFor(db.schema);
const silent = pino({ level: "silent" });

beforeAll(() => db.migrate());

const cleanups: (() => Promise<unknown>)[] = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup().catch(() => {});
});

/** Created but not started, so metrics and readiness can observe it from its first event. */
function makeWorker(options: Partial<WorkerOptions> & Pick<WorkerOptions, "queues">): Worker {
  const worker = createWorker({
    connection: db.url,
    schema: db.schema,
    logger: false,
    minPollIntervalMs: 20,
    maxPollIntervalMs: 200,
    ...options,
  });
  cleanups.push(() => worker.stop({ timeoutMs: 2000 }));
  return worker;
}

async function service(opts: { schema?: string; listen?: boolean; workers?: Worker[] } = {}) {
  const schema = opts.schema ?? db.schema;
  const metrics = createMetrics({ pool: db.pool, schema, logger: silent });
  const readiness = createReadiness({ pool: db.pool, schema, listen: opts.listen ?? true });
  for (const w of opts.workers ?? []) {
    metrics.observe(w);
    readiness.observe(w);
  }
  const http = await startHttpServer({ port: 0, host: "127.0.0.1", metrics, readiness, logger: silent });
  cleanups.push(
    () => http.close(),
    () => metrics.stop(),
  );
  const base = `http://127.0.0.1:${http.port}`;
  return { metrics, readiness, http, base, scrape: () => scrape(base) };
}

interface Sample {
  name: string;
  labels: Record<string, string>;
  value: number;
}

/** The samples of a Prometheus text exposition, with `get(name, labels)` matching the exact label set. */
async function scrape(base: string) {
  const res = await fetch(`${base}/metrics`);
  expect(res.status).toBe(200);
  const text = await res.text();
  const samples: Sample[] = [];
  for (const line of text.split("\n")) {
    const m = /^([a-zA-Z_:][\w:]*)(?:\{(.*)\})? (\S+)$/.exec(line);
    if (!m?.[1] || !m[3]) continue;
    const labels: Record<string, string> = {};
    for (const l of (m[2] ?? "").matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g))
      labels[l[1] as string] = l[2] as string;
    samples.push({ name: m[1], labels, value: Number(m[3]) });
  }
  const get = (name: string, labels: Record<string, string> = {}): number | undefined => {
    const want = Object.entries(labels);
    return samples.find(
      (s) =>
        s.name === name &&
        Object.keys(s.labels).length === want.length &&
        want.every(([k, v]) => s.labels[k] === v),
    )?.value;
  };
  return { text, contentType: res.headers.get("content-type"), get };
}

type Scrape = Awaited<ReturnType<typeof scrape>>;
const delta = (before: Scrape, after: Scrape, name: string, labels: Record<string, string> = {}) =>
  (after.get(name, labels) ?? 0) - (before.get(name, labels) ?? 0);

async function readyz(base: string): Promise<{ status: number; body: ReadinessReport }> {
  const res = await fetch(`${base}/readyz`);
  return { status: res.status, body: (await res.json()) as ReadinessReport };
}

function publish(queue: string, n: number, options: { delayMs?: number } = {}) {
  const items = Array.from({ length: n }, (_, i) => ({ payload: { i }, ...options }));
  return db.inTransaction((c) => outbox.publishMany(c, queue, items));
}

function gate() {
  let open!: () => void;
  const opened = new Promise<void>((resolve) => {
    open = resolve;
  });
  return { open, opened };
}

describe("metrics", () => {
  it("counts outcomes by queue and label, times acks, and tracks the backlog", async () => {
    const worker = makeWorker({
      queues: {
        ok: () => {},
        flaky: {
          handler: (_p, m) => {
            if (m.deliveries === 1) throw new TransientError("try again");
          },
          retry: constant(10),
        },
        bad: () => {
          throw new PermanentError("refused");
        },
      },
    });
    const svc = await service({ workers: [worker] });
    const before = await svc.scrape();
    expect(before.get("outbox_fetched_total")).toBe(0);

    await publish("ok", 5);
    await publish("flaky", 3);
    await publish("bad", 2);
    await publish("elsewhere", 4); // no worker serves it
    await svc.metrics.refresh();
    const queued = await svc.scrape();
    expect(queued.get("outbox_backlog", { queue: "ok" })).toBe(5);
    expect(queued.get("outbox_backlog", { queue: "flaky" })).toBe(3);
    expect(queued.get("outbox_backlog", { queue: "bad" })).toBe(2);
    expect(queued.get("outbox_backlog", { queue: "elsewhere" })).toBe(4);

    let acks = 0;
    let deads = 0;
    worker.on("acked", () => acks++);
    worker.on("dead_lettered", () => deads++);
    await worker.start();
    await until(() => acks === 8 && deads === 2, "8 acks and 2 dead letters");

    const after = await svc.scrape();
    expect(delta(before, after, "outbox_fetched_total")).toBe(13); // 10 rows + 3 retried ones fetched again
    expect(delta(before, after, "outbox_acked_total", { queue: "ok" })).toBe(5);
    expect(delta(before, after, "outbox_acked_total", { queue: "flaky" })).toBe(3);
    expect(after.get("outbox_acked_total", { queue: "bad" })).toBeUndefined();
    expect(delta(before, after, "outbox_retried_total", { queue: "flaky", transient: "true" })).toBe(3);
    expect(after.get("outbox_retried_total", { queue: "flaky", transient: "false" })).toBeUndefined();
    expect(delta(before, after, "outbox_dead_lettered_total", { queue: "bad", reason: "rejected" })).toBe(2);
    expect(after.get("outbox_released_total")).toBe(0);
    for (const [queue, n] of [
      ["ok", 5],
      ["flaky", 3],
    ] as const) {
      expect(after.get("outbox_handler_duration_seconds_count", { queue })).toBe(n);
      expect(after.get("outbox_handler_duration_seconds_bucket", { queue, le: "+Inf" })).toBe(n);
      expect(after.get("outbox_handler_duration_seconds_bucket", { queue, le: "60" })).toBe(n);
    }
    expect(after.get("outbox_handler_duration_seconds_count", { queue: "bad" })).toBeUndefined();
    expect(after.get("outbox_listener_state", { state: "listening" })).toBe(1);
    for (const state of ["connecting", "reconnecting", "poll_only", "stopped"]) {
      expect(after.get("outbox_listener_state", { state })).toBe(0);
    }

    await svc.metrics.refresh();
    const drained = await svc.scrape();
    // "ok" and "flaky" are gone from the status query altogether: their gauges must drop to 0, not stay stale.
    for (const queue of ["ok", "flaky"]) {
      expect(drained.get("outbox_backlog", { queue })).toBe(0);
      expect(drained.get("outbox_dead_letters", { queue })).toBe(0);
    }
    expect(drained.get("outbox_backlog", { queue: "bad" })).toBe(0);
    expect(drained.get("outbox_dead_letters", { queue: "bad" })).toBe(2);
    expect(drained.get("outbox_backlog", { queue: "elsewhere" })).toBe(4);
    expect(drained.get("outbox_oldest_ready_age_seconds", { queue: "ok" })).toBe(0);
    expect(drained.get("outbox_gauge_refresh_errors_total")).toBe(0);
  });

  it("exports scheduled, leased, expired and oldest-age gauges, and counts a lost lease", async () => {
    const slow = gate();
    const worker = makeWorker({
      leaseTtlMs: 60_000, // the heartbeat must not notice the stolen lease before the ack does
      queues: { slow: () => slow.opened },
    });
    const svc = await service({ workers: [worker] });
    const m = db.names.messages;
    await db.pool.query(`INSERT INTO ${m} (queue, payload, available_at)
                         VALUES ('aged', '{}', now() - interval '1 hour'), ('aged', '{}', now())`);
    await db.pool.query(`INSERT INTO ${m} (queue, payload, acquired_token, acquired_at, lease_expires_at,
                                           acquired_by, deliveries_count)
                         VALUES ('stuck', '{}', gen_random_uuid(), now() - interval '2 minutes',
                                 now() - interval '1 minute', 'gone', 1)`);
    await publish("later", 2, { delayMs: 3_600_000 });

    const dispatched = nextEvent(worker, "dispatched");
    await worker.start();
    await publish("slow", 1);
    await dispatched;
    await svc.metrics.refresh();
    const s = await svc.scrape();
    expect(s.get("outbox_backlog", { queue: "aged" })).toBe(2);
    expect(s.get("outbox_oldest_ready_age_seconds", { queue: "aged" })).toBeGreaterThan(3500);
    expect(s.get("outbox_scheduled", { queue: "later" })).toBe(2);
    expect(s.get("outbox_backlog", { queue: "later" })).toBe(0);
    expect(s.get("outbox_oldest_ready_age_seconds", { queue: "later" })).toBe(0);
    expect(s.get("outbox_leased", { queue: "slow" })).toBe(1);
    expect(s.get("outbox_backlog", { queue: "slow" })).toBe(0);
    expect(s.get("outbox_lease_expired", { queue: "stuck" })).toBe(1);
    expect(s.get("outbox_leased", { queue: "stuck" })).toBe(0);

    // Another "worker" takes the lease over; the handler's ack then writes nothing.
    await db.pool.query(`UPDATE ${m} SET acquired_token = gen_random_uuid() WHERE queue = 'slow'`);
    const lost = nextEvent(worker, "lease_lost");
    slow.open();
    await lost;
    const after = await svc.scrape();
    expect(after.get("outbox_lease_lost_total", { queue: "slow", phase: "ack" })).toBe(1);
    expect(after.get("outbox_acked_total", { queue: "slow" })).toBeUndefined();
  });

  it("exports subscriptions per queue and the events kept per topic, the topics bounded", async () => {
    const schema = db.freshSchema("mtop");
    await migrate({ connection: db.pool, schema });
    const { messages } = outboxNames(schema);
    const svc = await service({ schema });
    for (const [topic, queue] of [
      ["order.*", "billing"],
      ["payment.#", "billing"],
      ["order.*", "mail"],
    ] as const) {
      await subscribe(db.pool, { schema, topic, queue });
    }
    // Plain-SQL producers: order.placed reaches two queues; the rest is kept (no subscriber).
    const topicInsert = `INSERT INTO ${messages} (topic, payload) SELECT t, '{}' FROM unnest($1::text[]) AS t`;
    await db.pool.query(topicInsert, [
      ["order.placed", "refund.requested", "refund.requested", "refund.done"],
    ]);
    // A queue's own dead letter is not a kept event.
    await db.pool.query(
      `INSERT INTO ${outboxNames(schema).deadLetters} (id, queue, payload, headers, created_at, available_at,
         deliveries_count, attempts_count, failures_count, reason)
       VALUES (nextval(pg_get_serial_sequence($1, 'id')), 'billing', '{}', '{}', now(), now(), 1, 1, 1, 'rejected')`,
      [messages],
    );
    await svc.metrics.refresh();
    const s = await svc.scrape();
    expect(s.get("outbox_subscriptions", { queue: "billing" })).toBe(2);
    expect(s.get("outbox_subscriptions", { queue: "mail" })).toBe(1);
    expect(s.get("outbox_unrouted_events", { topic: "refund.requested" })).toBe(2);
    expect(s.get("outbox_unrouted_events", { topic: "refund.done" })).toBe(1);
    expect(s.get("outbox_unrouted_events", { topic: "order.placed" })).toBeUndefined();
    expect(s.get("outbox_unrouted_events", { topic: "billing" })).toBeUndefined();
    expect(s.get("outbox_unrouted_events", { topic: OTHER_TOPICS_LABEL })).toBeUndefined();
    expect(s.text).toContain("# TYPE outbox_unrouted_events gauge");

    // A queue unsubscribed from everything reads 0; a topic whose events were replayed loses its series.
    await unsubscribe(db.pool, { schema, topic: "order.*", queue: "mail" });
    await subscribe(db.pool, { schema, topic: "refund.requested", queue: "refunds" });
    await replayDeadLetters(db.pool, schema, { queue: "refund.requested", reason: "no_subscribers" });
    await svc.metrics.refresh();
    const after = await svc.scrape();
    expect(after.get("outbox_subscriptions", { queue: "mail" })).toBe(0);
    expect(after.get("outbox_subscriptions", { queue: "refunds" })).toBe(1);
    expect(after.get("outbox_unrouted_events", { topic: "refund.requested" })).toBeUndefined();
    expect(after.get("outbox_unrouted_events", { topic: "refund.done" })).toBe(1);
    expect(after.get("outbox_backlog", { queue: "refunds" })).toBe(2);

    // 60 more topics: a series for the 50 with most events, the rest summed under one label.
    await db.pool.query(topicInsert, [
      Array.from({ length: 60 }, (_, i) => `spam.t${String(i).padStart(2, "0")}`),
    ]);
    await db.pool.query(topicInsert, [["spam.t59", "spam.t59"]]);
    await svc.metrics.refresh();
    const many = await svc.scrape();
    const series = many.text.split("\n").filter((l) => l.startsWith("outbox_unrouted_events{"));
    expect(series).toHaveLength(51);
    expect(many.get("outbox_unrouted_events", { topic: "spam.t59" })).toBe(3);
    // Ties by name: refund.done and spam.t00…spam.t47 shown; spam.t48…spam.t58 summed.
    expect(many.get("outbox_unrouted_events", { topic: "spam.t47" })).toBe(1);
    expect(many.get("outbox_unrouted_events", { topic: "spam.t48" })).toBeUndefined();
    expect(many.get("outbox_unrouted_events", { topic: OTHER_TOPICS_LABEL })).toBe(11);
    const total = series.reduce((n, l) => n + Number(l.split(" ").pop()), 0);
    expect(total).toBe(1 + 60 + 2);
    expect(many.get("outbox_gauge_refresh_errors_total")).toBe(0);
  });

  it("leaves outbox_subscriptions out, and the rest in, for a role that may not read subscriptions", async () => {
    const schema = db.freshSchema("mrole");
    await migrate({ connection: db.pool, schema });
    const { quotedSchema, messages, deadLetters } = outboxNames(schema);
    await subscribe(db.pool, { schema, topic: "order.*", queue: "billing" });
    await db.pool.query(`INSERT INTO ${messages} (topic, payload) VALUES ('refund.done', '{}')`);
    const role = `metrics_nosubs_${Math.random().toString(36).slice(2, 8)}`;
    await db.pool.query(`CREATE ROLE ${role} NOLOGIN`);
    const pool = new pg.Pool({ connectionString: db.url, max: 2, options: `-c role=${role}` });
    cleanups.push(async () => {
      await pool.end();
      await db.pool.query(`DROP OWNED BY ${role}`);
      await db.pool.query(`DROP ROLE ${role}`);
    });
    await db.pool.query(`GRANT USAGE ON SCHEMA ${quotedSchema} TO ${role}`);
    await db.pool.query(
      `GRANT SELECT ON ${messages}, ${deadLetters} TO ${role}; GRANT EXECUTE ON FUNCTION ${quotedSchema}.batch_leased() TO ${role}`,
    );
    const metrics = createMetrics({ pool, schema, collectDefault: false, logger: silent });
    cleanups.push(() => metrics.stop());
    await metrics.refresh();
    const values = async (name: string) =>
      (await metrics.registry.getSingleMetric(name)?.get())?.values ?? [];
    expect(await values("outbox_subscriptions")).toEqual([]);
    expect(await values("outbox_unrouted_events")).toEqual([
      expect.objectContaining({ labels: { topic: "refund.done" }, value: 1 }),
    ]);
    // Granted, the series appears on the next refresh.
    await db.pool.query(`GRANT SELECT ON ${outboxNames(schema).subscriptions} TO ${role}`);
    await metrics.refresh();
    expect(await values("outbox_subscriptions")).toEqual([
      expect.objectContaining({ labels: { queue: "billing" }, value: 1 }),
    ]);
  });

  it("refreshes the gauges on its own timer once started", async () => {
    const metrics = createMetrics({
      pool: db.pool,
      schema: db.schema,
      gaugeIntervalMs: 20,
      collectDefault: false,
      logger: silent,
    });
    cleanups.push(() => metrics.stop());
    await publish("ticking", 1);
    metrics.start();
    const backlog = async () =>
      (await metrics.registry.getSingleMetric("outbox_backlog")?.get())?.values.find(
        (v) => v.labels.queue === "ticking",
      )?.value;
    await until(async () => (await backlog()) === 1, "backlog gauge set by the timer");
    await publish("ticking", 1);
    await until(async () => (await backlog()) === 2, "backlog gauge refreshed again");
    await metrics.stop();
    expect(await metrics.registry.getSingleMetric("process_cpu_user_seconds_total")).toBeUndefined();
  });

  it("joins a registry that already exports the process metrics", () => {
    const registry = new Registry();
    collectDefaultMetrics({ register: registry });
    const metrics = createMetrics({ pool: db.pool, schema: db.schema, registry, logger: silent });
    expect(metrics.registry).toBe(registry);
    expect(registry.getSingleMetric("outbox_acked_total")).toBeDefined();
  });

  it("counts failed gauge refreshes instead of throwing from the timer", async () => {
    const unmigrated = db.freshSchema("nomig");
    const metrics = createMetrics({
      pool: db.pool,
      schema: unmigrated,
      collectDefault: false,
      logger: silent,
    });
    cleanups.push(() => metrics.stop());
    await expect(metrics.refresh()).rejects.toThrow(/does not exist/);
    await expect(metrics.refresh()).rejects.toThrow(/does not exist/);
    const errors = await metrics.registry.getSingleMetric("outbox_gauge_refresh_errors_total")?.get();
    expect(errors?.values[0]?.value).toBe(2);
  });
});

describe("readiness", () => {
  it("/readyz is 503 before the worker starts, 200 when migrated and listening, 503 once it stops", async () => {
    const hold = gate();
    // A quick "warm" handler first: once a handler has finished fast, the worker queues rows locally.
    const worker = makeWorker({ concurrency: 1, queues: { hold: () => hold.opened, warm: () => {} } });
    const svc = await service({ workers: [worker] });

    const early = await readyz(svc.base);
    expect(early.status).toBe(503);
    expect(early.body.checks.worker).toEqual({ ok: false, state: "new" });

    await worker.start();
    // start() resolves once the listener's first attempt settled: on a loaded machine that attempt may
    // time out ("reconnecting"), and readiness follows the retry that lands.
    await expect.poll(async () => (await readyz(svc.base)).status).toBe(200);
    const up = await readyz(svc.base);
    expect(up.body).toEqual({
      ready: true,
      checks: {
        database: { ok: true },
        migrations: { ok: true },
        listener: { ok: true, state: "listening" },
        worker: { ok: true, state: "running" },
      },
    });

    // One row runs (and blocks), two wait in the local queue: stop hands those two back.
    let dispatched = 0;
    worker.on("dispatched", () => dispatched++);
    await publish("warm", 1);
    await publish("hold", 3);
    await until(() => dispatched === 2 && worker.held === 3, "one running, two queued");
    const released = nextEvent(worker, "released");
    const stopping = worker.stop({ timeoutMs: 5000 });
    await released;
    const draining = await readyz(svc.base);
    expect(draining.status).toBe(503);
    expect(draining.body.checks.worker).toEqual({ ok: false, state: "stopping" });
    hold.open();
    await stopping;

    const down = await readyz(svc.base);
    expect(down.status).toBe(503);
    expect(down.body.checks.worker).toEqual({ ok: false, state: "stopped" });
    expect(down.body.checks.listener).toEqual({ ok: false, state: "stopped" });
    expect(down.body.checks.database).toEqual({ ok: true });
    const s = await svc.scrape();
    expect(s.get("outbox_released_total")).toBe(2);
    expect(s.get("outbox_acked_total", { queue: "hold" })).toBe(1);
    expect(s.get("outbox_listener_state", { state: "stopped" })).toBe(1);
    expect(s.get("outbox_listener_state", { state: "listening" })).toBe(0);
  });

  it("/readyz is 503 with the pending migrations for a schema that is not migrated", async () => {
    const worker = makeWorker({ listen: false, queues: { idle: () => {} } });
    const svc = await service({ schema: db.freshSchema("fresh"), listen: false, workers: [worker] });
    await worker.start();
    const { applied } = await migrationState({ connection: db.pool, schema: db.schema });
    expect(applied.length).toBeGreaterThan(0);

    const { status, body } = await readyz(svc.base);
    expect(status).toBe(503);
    expect(body.ready).toBe(false);
    expect(body.checks.migrations).toEqual({ ok: false, pending: applied });
    expect(body.checks.database).toEqual({ ok: true });
    expect(body.checks.listener).toEqual({ ok: true, state: "disabled" });
    expect(body.checks.worker).toEqual({ ok: true, state: "running" });
  });

  it("/readyz is 503 after a fatal worker error, and the loop errors are counted", async () => {
    // Fetching from a schema with no tables fails at once; one failure is fatal here.
    const worker = makeWorker({
      schema: db.freshSchema("broken"),
      listen: false,
      maxConsecutiveFailures: 1,
      queues: { q: () => {} },
    });
    const svc = await service({ listen: false, workers: [worker] });
    await worker.start();
    await expect(worker.wait()).rejects.toThrow(/does not exist/);

    const { status, body } = await readyz(svc.base);
    expect(status).toBe(503);
    expect(body.checks.worker).toMatchObject({ ok: false, state: "fatal" });
    expect(body.checks.worker.error).toMatch(/does not exist/);
    expect(body.checks.database.ok && body.checks.migrations.ok).toBe(true);
    const s = await svc.scrape();
    expect(s.get("outbox_loop_errors_total", { loop: "fetch" })).toBe(1);
  });

  it("bounds the database check by its timeout and serves no password", async () => {
    // Accepts connections and never answers: a hung database, not a refused one.
    const sockets = new Set<Socket>();
    const blackhole = createServer((socket) => void sockets.add(socket));
    await new Promise<void>((resolve) => blackhole.listen(0, "127.0.0.1", resolve));
    const port = (blackhole.address() as { port: number }).port;
    const pool = new pg.Pool({ connectionString: `postgres://app:s3cr3t-pw@127.0.0.1:${port}/app` });
    pool.on("error", () => {});
    cleanups.push(async () => {
      for (const socket of sockets) socket.destroy();
      await pool.end();
      await new Promise((resolve) => blackhole.close(resolve));
    });

    const readiness = createReadiness({ pool, schema: db.schema, listen: false, timeoutMs: 200 });
    // The server never answers: only the check's own timeout can end it.
    const report = await readiness.check();
    expect(report.ready).toBe(false);
    expect(report.checks.database).toEqual({ ok: false, error: "database check timed out after 200 ms" });
    expect(report.checks.migrations.ok).toBe(false);
    expect(JSON.stringify(report)).not.toContain("s3cr3t");

    const refused = new pg.Pool({ connectionString: "postgres://app:s3cr3t-pw@127.0.0.1:1/app" });
    cleanups.push(() => refused.end());
    const r2 = await createReadiness({ pool: refused, schema: db.schema, listen: false }).check();
    expect(r2.checks.database.ok).toBe(false);
    expect(r2.checks.database.error).toMatch(/ECONNREFUSED/);
    expect(JSON.stringify(r2)).not.toContain("s3cr3t");
  });
});

describe("http server", () => {
  it("serves /healthz, /metrics in the registry's format, 404 and 405", async () => {
    const svc = await service({ listen: false });
    const health = await fetch(`${svc.base}/healthz?probe=1`);
    expect(health.status).toBe(200);
    expect(await health.json()).toEqual({ status: "ok" });

    const s = await svc.scrape();
    expect(s.contentType).toBe(svc.metrics.registry.contentType);
    expect(s.get("process_cpu_user_seconds_total")).toBeGreaterThanOrEqual(0);
    expect(s.text).toContain("# TYPE outbox_handler_duration_seconds histogram");

    expect((await fetch(`${svc.base}/nope`)).status).toBe(404);
    const post = await fetch(`${svc.base}/metrics`, { method: "POST" });
    expect(post.status).toBe(405);
    expect(post.headers.get("allow")).toBe("GET");
    expect((await fetch(`${svc.base}/readyz`, { method: "DELETE" })).status).toBe(405);
  });

  it("close() cuts a request that never finishes after the grace period", async () => {
    let asked = false;
    const readiness: Pick<Readiness, "check"> = {
      check: () => {
        asked = true;
        return new Promise(() => {});
      },
    };
    const metrics: Pick<Metrics, "registry"> = createMetrics({
      pool: db.pool,
      schema: db.schema,
      collectDefault: false,
      logger: silent,
    });
    const http = await startHttpServer({ port: 0, metrics, readiness, logger: silent, closeGraceMs: 200 });
    expect(http.port).toBeGreaterThan(0);
    const hanging = fetch(`http://127.0.0.1:${http.port}/readyz`).then(
      () => "answered",
      () => "cut",
    );
    await until(() => asked, "the request reached the handler");
    // The readiness check never ends: only the grace period's cut can end close() and the request.
    await http.close();
    expect(await hanging).toBe("cut");
  });
});
