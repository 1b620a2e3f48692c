import { describe, expect, it } from "vitest";
import { z } from "zod";
import { OutboxConfigError } from "../../src/contract/errors.js";
import {
  payloadJsonSchema,
  queueSchemaDocument,
  schemaFileName,
  schemaFileNames,
} from "../../src/describe/json-schema.js";
import { queuesOfModule } from "../../src/describe/queues-of-module.js";
import { defineQueue } from "../../src/produce/queue.js";
import { handle } from "../../src/worker/options.js";

const order = defineQueue(
  "order.placed",
  z.object({
    orderId: z.number().int(),
    note: z.string().optional(),
    currency: z.enum(["EUR", "USD"]).default("EUR"),
  }),
);

describe("payloadJsonSchema", () => {
  it("is the output side of the zod schema: what is stored and relayed", () => {
    const schema = payloadJsonSchema(order);
    expect(schema).toMatchObject({
      type: "object",
      properties: {
        orderId: { type: "integer" },
        note: { type: "string" },
        currency: { enum: ["EUR", "USD"] },
      },
      additionalProperties: false,
    });
    // A default is filled in at publish: the stored payload always has it.
    expect(schema.required).toEqual(["orderId", "currency"]);
    expect(schema).not.toHaveProperty("$schema");
  });

  it("is any JSON value for a queue without a schema", () => {
    expect(payloadJsonSchema(defineQueue("free"))).toEqual({});
  });

  it("refuses what JSON Schema cannot say, naming the queue and the reason", () => {
    const dated = defineQueue("billing:invoice", z.object({ at: z.date() }));
    expect(() => payloadJsonSchema(dated)).toThrow(OutboxConfigError);
    expect(() => payloadJsonSchema(dated)).toThrow(/queue "billing:invoice".*Date cannot be represented/);
    const transformed = defineQueue("t", z.object({ n: z.string().transform((s) => s.length) }));
    expect(() => payloadJsonSchema(transformed)).toThrow(/queue "t".*Transforms cannot be represented/);
  });

  it("writes draft-07 for AsyncAPI and 2020-12 for the files, the same constraints", () => {
    const tuple = defineQueue("pair", z.tuple([z.string(), z.number()]));
    expect(payloadJsonSchema(tuple, "draft-07")).toMatchObject({
      items: [{ type: "string" }, { type: "number" }],
    });
    expect(payloadJsonSchema(tuple, "draft-2020-12")).toMatchObject({
      prefixItems: [{ type: "string" }, { type: "number" }],
    });
  });
});

describe("queueSchemaDocument", () => {
  it("names the queue: $schema 2020-12, $id the file name, title the queue", () => {
    const document = queueSchemaDocument(defineQueue("billing/invoice:created", z.object({ n: z.number() })));
    expect(document).toMatchObject({
      $schema: "https://json-schema.org/draft/2020-12/schema",
      $id: "billing%2Finvoice%3Acreated.schema.json",
      title: "billing/invoice:created",
      type: "object",
    });
  });
});

describe("schema file names", () => {
  it("are safe for / and :, and distinct for distinct queues", () => {
    expect(schemaFileName("order.placed")).toBe("order.placed.schema.json");
    expect(schemaFileName("billing/invoice:created")).toBe("billing%2Finvoice%3Acreated.schema.json");
    const names = ["a/b", "a:b", "a_b", "a-b", "a.b", "a2Fb"];
    const files = [...schemaFileNames(names).values()];
    expect(new Set(files).size).toBe(names.length);
    for (const file of files) expect(file).not.toMatch(/[/:\\]/);
  });

  it("refuses queues that would share a file on a case-insensitive file system", () => {
    expect(() => schemaFileNames(["Orders", "orders"])).toThrow(/"Orders" and "orders" differ only in case/);
  });
});

describe("queuesOfModule", () => {
  it("finds definitions in named exports, arrays and objects, once each", () => {
    const other = defineQueue("other");
    const queues = queuesOfModule({ order, list: [order, other], map: { order } }, "q.js");
    expect(queues.map((q) => q.name)).toEqual(["order.placed", "other"]);
  });

  it("reads a handlers module's schemas (handle(queue, fn)), a bare handler as any JSON", () => {
    const queues = queuesOfModule(
      { default: { "order.placed": handle(order, () => {}), "audit.log": () => {} } },
      "handlers.js",
    );
    expect(queues.map((q) => [q.name, q.schema === order.schema])).toEqual([
      ["order.placed", true],
      ["audit.log", false],
    ]);
  });

  it("refuses a module without queues, and one queue defined twice differently, naming the file", () => {
    expect(() => queuesOfModule({ x: 1 }, "empty.js")).toThrow(/empty\.js exports no queue definitions/);
    const again = defineQueue("order.placed", z.object({}));
    expect(() => queuesOfModule({ order, again }, "twice.js")).toThrow(
      /twice\.js defines queue "order\.placed" twice with different schemas/,
    );
  });
});

describe("the consumer examples' queue", () => {
  it("is the demo's queue: the generated types describe what the demo publishes", async () => {
    const { orderPlaced: demo } = await import("../../src/cli/demo-command.js");
    const { orderPlaced: example } = await import("../../examples/consumers/queues.js");
    expect(example.name).toBe(demo.name);
    expect(payloadJsonSchema(example)).toEqual(payloadJsonSchema(demo));
  });
});
