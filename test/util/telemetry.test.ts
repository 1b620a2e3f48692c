import { execFile } from "node:child_process";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import http from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import path from "node:path";
import { promisify } from "node:util";
import { context, createTraceState, SpanKind, SpanStatusCode, trace } from "@opentelemetry/api";
import type { ReadableSpan } from "@opentelemetry/sdk-trace-base";
import pino from "pino";
import { afterAll, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { createRelay } from "../../src/relay/create-relay.js";
import type { Relay } from "../../src/relay/relay.js";
import { constant } from "../../src/retry/strategies.js";
import { testDatabase } from "../support/database.js";
import { registerTestTracing } from "../support/otel.js";
import { publisherFor, until, workerFactory } from "../support/worker.js";

/**
 * OpenTelemetry from publish to handler: an SDK (in-memory exporter, async-hooks context, W3C propagator)
 * registered globally for this file only (vitest runs each file in its own worker), as an app would.
 */

const db = testDatabase("otel");
const workers = workerFactory(db);
const outbox = publisherFor(db.schema);

const exporter = registerTestTracing();
const tracer = trace.getTracer("test");

beforeAll(async () => {
  await db.migrate();
});
beforeEach(() => exporter.reset());

const spans = (name: string): ReadableSpan[] => exporter.getFinishedSpans().filter((s) => s.name === name);

/** Publishes in a transaction inside a producer span; returns the id and the producer's span context. */
async function publishTraced(
  queue: string,
  payload: unknown,
  options: Parameters<typeof outbox.publish>[3] = {},
) {
  const producer = tracer.startSpan("checkout");
  try {
    const id = await context.with(trace.setSpan(context.active(), producer), () =>
      db.inTransaction((client) => outbox.publish(client, queue, payload, options)),
    );
    return { id, producer: producer.spanContext() };
  } finally {
    producer.end();
  }
}

async function storedHeaders(id: string): Promise<Record<string, string>> {
  const { rows } = await db.pool.query(`SELECT headers FROM ${db.names.messages} WHERE id = $1`, [id]);
  return rows[0].headers;
}

describe("OpenTelemetry with an SDK registered", () => {
  it("one trace from the producer's span through publish to the handler's CONSUMER span and its children", async () => {
    const seen: Record<string, string>[] = [];
    const { id, producer } = await publishTraced("otel.ok", { n: 1 }, { key: "order-7" });
    // The injected context is in the row, next to the caller's nothing.
    expect(await storedHeaders(id)).toEqual({
      traceparent: `00-${producer.traceId}-${producer.spanId}-01`,
    });
    await workers.start({
      queues: {
        "otel.ok": async (_payload, message) => {
          seen.push(message.headers);
          // The handler's own span: a child of the process span only if that span is active here.
          await tracer.startActiveSpan("handler work", async (span) => {
            await new Promise((resolve) => setImmediate(resolve));
            span.end();
          });
        },
      },
    });
    await until(() => spans("process otel.ok").length === 1, "the process span");

    const [processSpan] = spans("process otel.ok");
    const [work] = spans("handler work");
    expect(processSpan?.kind).toBe(SpanKind.CONSUMER);
    expect(processSpan?.spanContext().traceId).toBe(producer.traceId);
    expect(processSpan?.parentSpanContext?.spanId).toBe(producer.spanId);
    expect(processSpan?.links.map((l) => l.context.spanId)).toEqual([producer.spanId]);
    expect(processSpan?.attributes).toEqual({
      "messaging.system": "pg_outbox",
      "messaging.operation.type": "process",
      "messaging.operation.name": "process",
      "messaging.destination.name": "otel.ok",
      "messaging.message.id": id,
      "messaging.pg_outbox.message.delivery_count": 1,
      "messaging.pg_outbox.message.key": "order-7",
      "messaging.pg_outbox.outcome": "ack",
    });
    expect(processSpan?.status.code).toBe(SpanStatusCode.UNSET);
    expect(work?.spanContext().traceId).toBe(producer.traceId);
    expect(work?.parentSpanContext?.spanId).toBe(processSpan?.spanContext().spanId);
    expect(seen).toEqual([{ traceparent: `00-${producer.traceId}-${producer.spanId}-01` }]);
  });

  it("a failing handler's span has status ERROR and the exception; each delivery says what was decided", async () => {
    const { producer } = await publishTraced("otel.fail", { n: 2 });
    await workers.start({
      queues: {
        "otel.fail": {
          handler: () => {
            throw new TypeError("boom");
          },
          maxAttempts: 2,
          retry: constant(10),
        },
      },
    });
    await until(() => spans("process otel.fail").length === 2, "two process spans");

    const [first, second] = spans("process otel.fail");
    for (const span of [first, second]) {
      expect(span?.spanContext().traceId).toBe(producer.traceId);
      expect(span?.parentSpanContext?.spanId).toBe(producer.spanId);
      expect(span?.status).toEqual({ code: SpanStatusCode.ERROR, message: "boom" });
      expect(span?.attributes["error.type"]).toBe("TypeError");
      const exception = span?.events.find((e) => e.name === "exception");
      expect(exception?.attributes?.["exception.type"]).toBe("TypeError");
      expect(exception?.attributes?.["exception.message"]).toBe("boom");
    }
    expect(first?.attributes).toMatchObject({
      "messaging.pg_outbox.message.delivery_count": 1,
      "messaging.pg_outbox.outcome": "retry",
      "messaging.pg_outbox.retry.delay_ms": 10,
    });
    expect(second?.attributes).toMatchObject({
      "messaging.pg_outbox.message.delivery_count": 2,
      "messaging.pg_outbox.outcome": "dead_letter",
      "messaging.pg_outbox.dead_letter.reason": "retries_exhausted",
    });
  });

  it("keeps a traceparent the caller set, and injects into the other messages of a batch", async () => {
    const explicit = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    // A producer span whose trace has a tracestate: the propagator injects it next to traceparent.
    const remote = trace.setSpanContext(context.active(), {
      traceId: "4bf92f3577b34da6a3ce929d0e0e4736",
      spanId: "00f067aa0ba902b7",
      traceFlags: 1,
      isRemote: true,
      traceState: createTraceState("vendor=x"),
    });
    const producer = tracer.startSpan("batch", {}, remote);
    const active = trace.setSpan(context.active(), producer);
    const id = await context.with(active, () =>
      db.inTransaction((client) =>
        outbox.publish(client, "otel.explicit", { n: 3 }, { headers: { traceparent: explicit, a: "1" } }),
      ),
    );
    // Nothing injected at all: the active span's tracestate belongs to another trace.
    expect(await storedHeaders(id)).toEqual({ traceparent: explicit, a: "1" });

    const ids = await context.with(active, () =>
      db.inTransaction((client) =>
        outbox.publishMany(client, "otel.explicit", [
          { payload: 1, headers: { traceparent: explicit } },
          // A caller's header wins over an injected one of the same name.
          { payload: 2, headers: { b: "2", tracestate: "mine=1" } },
        ]),
      ),
    );
    producer.end();
    const { traceId, spanId } = producer.spanContext();
    expect(await storedHeaders(ids[0] ?? "")).toEqual({ traceparent: explicit });
    expect(await storedHeaders(ids[1] ?? "")).toEqual({
      b: "2",
      traceparent: `00-${traceId}-${spanId}-01`,
      tracestate: "mine=1",
    });
  });

  it("a message published outside any span gets no headers, and its process span is a root", async () => {
    const id = await db.inTransaction((client) => outbox.publish(client, "otel.root", { n: 4 }));
    expect(await storedHeaders(id)).toEqual({});
    await workers.start({ queues: { "otel.root": () => {} } });
    await until(() => spans("process otel.root").length === 1, "the process span");
    const [span] = spans("process otel.root");
    expect(span?.parentSpanContext).toBeUndefined();
    expect(span?.links).toEqual([]);
  });

  describe("through the HTTP relay", () => {
    const received: http.IncomingHttpHeaders[] = [];
    let server: http.Server;
    let relay: Relay | undefined;

    beforeAll(async () => {
      server = http.createServer((req, res) => {
        req.resume();
        req.on("end", () => {
          received.push(req.headers);
          res.writeHead(204).end();
        });
      });
      await new Promise<void>((listening) => server.listen(0, "127.0.0.1", listening));
    });
    afterAll(async () => {
      await relay?.close();
      await new Promise((closed) => server.close(closed));
    });

    it("a relayed message carries the producer's trace id to the receiver", async () => {
      const { port } = server.address() as AddressInfo;
      relay = await createRelay(
        { type: "http", url: `http://127.0.0.1:${port}/hook` } as Parameters<typeof createRelay>[0],
        { logger: pino({ level: "silent" }) },
      );
      const { producer } = await publishTraced("otel.relay", { n: 5 });
      await workers.start({ queues: { "otel.relay": { handler: relay.handler, rawPayload: true } } });
      await until(() => received.length === 1, "the relayed request");

      // Binary-mode CloudEvents send ce-traceparent; the relay before them sent traceparent.
      const header = received[0]?.["ce-traceparent"] ?? received[0]?.traceparent;
      expect(String(header).split("-")[1]).toBe(producer.traceId);
      // The relay ran as a handler: its delivery has a process span in the same trace.
      await until(() => spans("process otel.relay").length === 1, "the relay's process span");
      expect(spans("process otel.relay")[0]?.spanContext().traceId).toBe(producer.traceId);
    });
  });
});

describe("without @opentelemetry/api", () => {
  it("publishes and handles a message, and never loads the API", async () => {
    const dir = await mkdtemp(path.join(tmpdir(), "otel-absent-"));
    const record = path.join(dir, "resolved.txt");
    try {
      const { stdout } = await promisify(execFile)(
        process.execPath,
        [
          "--import",
          "tsx",
          "--import",
          "./test/support/fixtures/otel-absent-register.mjs",
          "test/support/fixtures/otel-absent.ts",
        ],
        {
          timeout: 30_000,
          env: { ...process.env, DATABASE_URL: db.url, OUTBOX_SCHEMA: db.schema, OTEL_RECORD: record },
        },
      );
      const out = JSON.parse(stdout.trim().split("\n").at(-1) ?? "{}");
      expect(out.result).toEqual({ id: out.id, headers: { tenant: "t1" }, payload: { n: 1 } });
      expect(out.required).toEqual([]);
      const resolved = (await readFile(record, "utf8")).trim().split("\n");
      // The lazy import was tried (once: it is cached) and refused, as a missing package is.
      expect(resolved.filter((line) => line.startsWith("refused"))).toEqual(["refused @opentelemetry/api"]);
      // Not vacuous: the hook saw this package's modules, and none of OpenTelemetry's.
      expect(resolved.some((url) => url.endsWith("/src/util/tracing.ts"))).toBe(true);
      expect(resolved.filter((url) => url.includes("@opentelemetry"))).toEqual([
        "refused @opentelemetry/api",
      ]);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });
});
