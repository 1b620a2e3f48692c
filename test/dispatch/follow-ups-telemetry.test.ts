import { beforeAll, expect, it } from "vitest";
import { followUp } from "../../src/index.js";
import { testDatabase } from "../support/database.js";
import { registerTestTracing } from "../support/otel.js";
import { publisherFor, until, workerFactory } from "../support/worker.js";

/**
 * Follow-ups continue the handler's trace: both forms (returned, and published through the context) carry a
 * traceparent of the handler's process span, as a publish inside the handler would. An SDK is registered
 * for this file only (vitest runs each file in its own worker).
 */

const db = testDatabase("fupot");
const workers = workerFactory(db);
const outbox = publisherFor(db.schema);
const exporter = registerTestTracing();

beforeAll(async () => {
  await db.migrate();
});

it("returned and context-published follow-ups carry the handler's trace context", async () => {
  await db.inTransaction((c) => outbox.publish(c, "traced", {}));
  await workers.start({
    queues: {
      traced: async (_p, message) => {
        await new Promise((resolve) => setImmediate(resolve));
        message.publish("next", { form: "context" });
        return followUp("next", { form: "returned" });
      },
    },
  });
  const next = async () =>
    (
      await db.pool.query(
        `SELECT payload ->> 'form' AS form, headers ->> 'traceparent' AS traceparent
         FROM ${db.names.messages} WHERE queue = 'next' ORDER BY id`,
      )
    ).rows as { form: string; traceparent: string | null }[];
  await until(async () => (await next()).length === 2, "both follow-ups inserted");
  const [span] = exporter.getFinishedSpans().filter((s) => s.name === "process traced");
  const { traceId, spanId } = span?.spanContext() ?? {};
  expect(await next()).toEqual([
    { form: "context", traceparent: `00-${traceId}-${spanId}-01` },
    { form: "returned", traceparent: `00-${traceId}-${spanId}-01` },
  ]);
});
