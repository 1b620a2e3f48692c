import { describe, expect, it } from "vitest";
import { z } from "zod";
import { OutboxConfigError } from "../../src/contract/errors.js";
import {
  payloadJsonSchema,
  queueSchemaDocument,
  schemaFileName,
  schemaFileNames,
  sharedTopic,
  topicJsonSchema,
  topicSchemaDocument,
  topicSchemaFileName,
} from "../../src/describe/json-schema.js";
import { describeModule, mergeSubscriptions, queuesOfModule } from "../../src/describe/queues-of-module.js";
import { defineQueue } from "../../src/produce/queue.js";
import { defineTopic, subscriberQueue } from "../../src/produce/topic.js";
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
    expect(() => queuesOfModule({ x: 1 }, "empty.js")).toThrow(
      /empty\.js exports no queue or topic definitions/,
    );
    const again = defineQueue("order.placed", z.object({}));
    expect(() => queuesOfModule({ order, again }, "twice.js")).toThrow(
      /twice\.js defines queue "order\.placed" twice with different schemas/,
    );
  });
});

const placed = defineTopic(
  "order.placed",
  z.object({ orderId: z.number().int(), currency: z.enum(["EUR", "USD"]).default("EUR") }),
);

describe("topics' JSON Schema", () => {
  it("is the output side of the topic's zod schema, as a queue's is; any JSON without one", () => {
    expect(topicJsonSchema(placed)).toMatchObject({
      type: "object",
      properties: { orderId: { type: "integer" }, currency: { enum: ["EUR", "USD"] } },
      required: ["orderId", "currency"],
    });
    expect(topicJsonSchema(placed)).not.toHaveProperty("$schema");
    expect(topicJsonSchema(defineTopic("free.event"))).toEqual({});
    // The same schema as a queue holding it: a subscriber's payload is the topic's event.
    expect(topicJsonSchema(placed, "draft-07")).toEqual(
      payloadJsonSchema(subscriberQueue(placed, "billing"), "draft-07"),
    );
  });

  it("refuses what JSON Schema cannot say, naming the topic", () => {
    const dated = defineTopic("order.dated", z.object({ at: z.date() }));
    expect(() => topicJsonSchema(dated)).toThrow(OutboxConfigError);
    expect(() => topicJsonSchema(dated)).toThrow(/topic "order\.dated".*Date cannot be represented/);
  });

  it("has its own file: <topic>.topic.json, $id the file name, never a queue's file", () => {
    expect(topicSchemaDocument(placed)).toMatchObject({
      $schema: "https://json-schema.org/draft/2020-12/schema",
      $id: "order.placed.topic.json",
      title: "order.placed",
      type: "object",
    });
    expect(topicSchemaFileName("billing/invoice:created")).toBe("billing%2Finvoice%3Acreated.topic.json");
    // A queue named like the topic, or like the topic's file, keeps a file of its own.
    for (const queue of ["order.placed", "order.placed.topic", "order.placed.topic.json"])
      expect(schemaFileName(queue)).not.toBe(topicSchemaFileName("order.placed"));
    expect(() => schemaFileNames(["Order.placed", "order.placed"], "topics")).toThrow(
      /topics "Order\.placed" and "order\.placed" differ only in case/,
    );
    expect([...schemaFileNames(["order.placed"], "topics")]).toEqual([
      ["order.placed", "order.placed.topic.json"],
    ]);
  });

  it("is shared by a subscriberQueue: the queue's file refers to the topic's file", () => {
    const billing = subscriberQueue(placed, "billing");
    expect(sharedTopic(billing, [placed])).toBe(placed);
    expect(queueSchemaDocument(billing, [placed])).toEqual({
      $schema: "https://json-schema.org/draft/2020-12/schema",
      $id: "billing.schema.json",
      title: "billing",
      description:
        'Payload of outbox queue "billing": the events of topic "order.placed", whose schema it shares.',
      $ref: "order.placed.topic.json",
    });
    // handle(subscriberQueue(...)) carries the same schema: a handlers module's entry shares it too.
    const [fromHandlers] = describeModule({ default: { billing: handle(billing, () => {}) } }, "h.js").queues;
    expect(fromHandlers && sharedTopic(fromHandlers, [placed])).toBe(placed);
    // Without the topic at hand, or with a look-alike schema of its own, the queue keeps its own schema.
    expect(queueSchemaDocument(billing)).toMatchObject({ type: "object", required: ["orderId", "currency"] });
    const alike = defineQueue(
      "alike",
      z.object({ orderId: z.number().int(), currency: z.enum(["EUR", "USD"]).default("EUR") }),
    );
    expect(sharedTopic(alike, [placed])).toBeUndefined();
    expect(queueSchemaDocument(alike, [placed])).not.toHaveProperty("$ref");
    // A schema-less queue and a schema-less topic share nothing: both are any JSON.
    expect(sharedTopic(defineQueue("free"), [defineTopic("free.event")])).toBeUndefined();
  });
});

describe("describeModule", () => {
  it("finds topics beside queues, in named exports, arrays and objects, once each", () => {
    const cancelled = defineTopic("order.cancelled");
    const found = describeModule({ placed, topics: [placed, cancelled], order }, "m.js");
    expect(found.topics.map((t) => t.topic)).toEqual(["order.placed", "order.cancelled"]);
    expect(found.queues.map((q) => q.name)).toEqual(["order.placed"]);
    // Topics alone describe something; queuesOfModule still wants queues.
    expect(describeModule({ placed }, "t.js").queues).toEqual([]);
    expect(() => queuesOfModule({ placed }, "t.js")).toThrow(/t\.js exports no queue definitions/);
    expect(() => describeModule({ x: 1 }, "e.js")).toThrow(/e\.js exports no queue or topic definitions/);
  });

  it("reads subscriptions from a handlers map's `subscribe` and from a `subscriptions` export, each pattern once", () => {
    const found = describeModule(
      {
        default: {
          billing: { handler: () => {}, subscribe: ["order.placed"] },
          email: { handler: () => {}, subscribe: ["order.*", "order.*"] },
          audit: () => {},
        },
        subscriptions: { email: ["payment.#"], search: ["#"] },
      },
      "handlers.js",
    );
    expect(Object.fromEntries(found.subscriptions)).toEqual({
      billing: ["order.placed"],
      email: ["order.*", "payment.#"],
      search: ["#"],
    });
    expect(found.queues.map((q) => q.name)).toEqual(["billing", "email", "audit"]);
  });

  it("refuses a malformed subscription or a topic defined twice differently, naming the file and the field", () => {
    expect(() => describeModule({ placed, subscriptions: { billing: ["order..x"] } }, "s.js")).toThrow(
      /s\.js: subscriptions\.billing\[0\]: "order\.\.x" is not a topic pattern/,
    );
    expect(() => describeModule({ placed, subscriptions: { billing: "order.*" } }, "s.js")).toThrow(
      /s\.js: subscriptions\.billing must be an array/,
    );
    expect(() =>
      describeModule({ default: { billing: { handler: () => {}, subscribe: ["a.#.b", 7] } } }, "h.js"),
    ).toThrow(/h\.js: default\.billing\.subscribe\[1\]: must be a non-empty string/);
    expect(() => describeModule({ placed, subscriptions: { "bad queue": ["a"] } }, "s.js")).toThrow(
      /s\.js: subscriptions\.bad queue: "bad queue" may only hold/,
    );
    const again = defineTopic("order.placed", z.object({}));
    expect(() => describeModule({ placed, again }, "twice.js")).toThrow(
      /twice\.js defines topic "order\.placed" twice with different schemas/,
    );
  });

  it("merges declared subscriptions from several places: module, config, relays", () => {
    const merged = mergeSubscriptions(new Map([["billing", ["order.placed"]]]), undefined, {
      billing: ["order.placed", "order.#"],
      relay: ["order.*"],
    });
    expect(Object.fromEntries(merged)).toEqual({ billing: ["order.placed", "order.#"], relay: ["order.*"] });
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
