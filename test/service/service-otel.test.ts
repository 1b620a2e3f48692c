// The service traces too: `outbox-worker run` with an OpenTelemetry SDK preloaded by `node --import` (the
// CLI's way in docs/guide/tracing.md) runs each handler in a `process <queue>` span, child of the producer's
// trace.
import { type ChildProcess, spawn } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import { writeFile } from "node:fs/promises";
import path from "node:path";
import { afterEach, beforeAll, expect, it } from "vitest";
import { testDatabase } from "../support/database.js";
import { testTempDir } from "../support/temp-dir.js";
import { publisherFor, until } from "../support/worker.js";

const db = testDatabase("svcotel");
const outbox = publisherFor(db.schema);
const ROOT = path.resolve(".");
let child: ChildProcess | undefined;
beforeAll(() => db.migrate());
afterEach(() => {
  child?.kill("SIGKILL");
});

it("outbox-worker run, with the SDK preloaded by --import, runs each handler in a process span of the producer's trace", async () => {
  const dir = await testTempDir("outbox-otel-");
  const spans = path.join(dir, "spans.jsonl");
  const handlers = path.join(dir, "handlers.mjs");
  await writeFile(handlers, `export default { "orders.placed": async () => {} };\n`);
  const traceId = "4bf92f3577b34da6a3ce929d0e0e4736";
  await db.inTransaction((c) =>
    outbox.publish(
      c,
      "orders.placed",
      { id: 1 },
      { headers: { traceparent: `00-${traceId}-00f067aa0ba902b7-01` } },
    ),
  );
  child = spawn(
    process.execPath,
    [
      "--import",
      path.join(ROOT, "test/support/fixtures/otel-preload.mjs"),
      path.join(ROOT, "dist/cli/main.js"),
      "run",
      "--handlers",
      handlers,
      "--schema",
      db.schema,
      "--log-level",
      "warn",
    ],
    {
      env: { ...process.env, DATABASE_URL: db.url, OTEL_SPANS_FILE: spans },
      stdio: ["ignore", "inherit", "inherit"],
    },
  );
  // Complete lines only: the service may be halfway through appending one (or have created the file empty).
  const read = () =>
    existsSync(spans)
      ? readFileSync(spans, "utf8")
          .split("\n")
          .slice(0, -1)
          .map(
            (l) =>
              JSON.parse(l) as {
                name: string;
                kind: number;
                traceId: string;
                attributes: Record<string, unknown>;
              },
          )
      : [];
  await until(() => read().some((s) => s.name === "process orders.placed"), "the process span");
  const span = read().find((s) => s.name === "process orders.placed");
  // CONSUMER (kind 4), in the trace the producer's traceparent named, with the messaging attributes.
  expect(span).toMatchObject({
    kind: 4,
    traceId,
    attributes: { "messaging.destination.name": "orders.placed", "messaging.pg_outbox.outcome": "ack" },
  });
  child.kill("SIGTERM");
});
