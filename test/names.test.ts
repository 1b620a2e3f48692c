import { describe, expect, it } from "vitest";
import { OutboxConfigError } from "../src/errors.js";
import { validateQueueName } from "../src/produce/queue.js";
import { outboxNames, validateSchemaName } from "../src/sql/names.js";
import { redactConnectionString, redactSecrets } from "../src/util/redact.js";

describe("schema names", () => {
  it.each(["outbox", "_private", "app_outbox_2", "a".repeat(58)])("accepts %s", (name) => {
    expect(validateSchemaName(name)).toBe(name);
  });

  it.each([
    ['x"; drop table t;--', "not a plain identifier"],
    ["Outbox", "not a plain identifier"],
    ["out-box", "not a plain identifier"],
    ["out box", "not a plain identifier"],
    ["1outbox", "not a plain identifier"],
    ["outbox$", "not a plain identifier"],
    ["é", "not a plain identifier"],
    ["", "non-empty"],
    ["pg_outbox", "reserved by Postgres"],
    ["information_schema", "system schema"],
    ["a".repeat(59), "63 bytes"],
  ])("rejects %j (%s)", (name, reason) => {
    expect(() => validateSchemaName(name)).toThrow(OutboxConfigError);
    expect(() => validateSchemaName(name)).toThrow(reason);
  });

  it("derives every name within 63 bytes and quoted", () => {
    const names = outboxNames("a".repeat(58));
    expect(Buffer.byteLength(names.channel)).toBeLessThanOrEqual(63);
    expect(names.messages).toBe(`"${"a".repeat(58)}".messages`);
  });
});

describe("queue names", () => {
  it.each(["orders", "order.created", "billing:v2/invoice-paid", "Q1"])("accepts %s", (name) => {
    expect(validateQueueName(name)).toBe(name);
  });
  it.each(["", " orders", "orders\n", "a'b", "-x", "x".repeat(201)])("rejects %j", (name) => {
    expect(() => validateQueueName(name)).toThrow(OutboxConfigError);
  });
});

describe("redaction", () => {
  it("hides the password in the user-info and in the query string", () => {
    const out = redactConnectionString(
      "postgres://app:canary-pw@db:5432/x?sslmode=require&password=canary-pw",
    );
    expect(out).not.toContain("canary-pw");
    expect(out).toContain("app:***@db:5432/x");
    expect(out).toContain("sslmode=require");
  });
  it("redacts strings that do not parse as URLs", () => {
    expect(redactConnectionString("postgres://u:canary pw@@ host/db password=canary")).not.toContain(
      "canary",
    );
  });
  it("replaces known secrets in free text", () => {
    expect(redactSecrets("auth failed for canary-pw", ["canary-pw"])).toBe("auth failed for ***");
  });
});
