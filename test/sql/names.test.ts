import { describe, expect, it } from "vitest";
import { OutboxConfigError } from "../../src/contract/errors.js";
import { validateQueueName } from "../../src/contract/queue.js";
import { outboxNames, validateSchemaName } from "../../src/sql/names.js";
import { findJsonSyntaxError, parseJsonQuietly } from "../../src/util/json-error.js";
import {
  redactConnectionString,
  registerSecrets,
  registerUrlSecrets,
  scrubDeep,
  scrubJsonLines,
  scrubSecrets,
} from "../../src/util/redact.js";

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
  it("hides the whole user info and the password in the query string", () => {
    const out = redactConnectionString(
      "postgres://app:canary-pw@db:5432/x?sslmode=require&password=canary-pw",
    );
    expect(out).not.toContain("canary-pw");
    expect(out).toBe("postgres://***@db:5432/x?sslmode=require&password=***");
  });
  it("hides a username-only token (nats://TOKEN@host) and token-like query parameters", () => {
    expect(redactConnectionString("nats://canaryTok3n@127.0.0.1:4222")).toBe("nats://***@127.0.0.1:4222");
    expect(redactConnectionString("redis://default:canary-rp@r:6379/0")).toBe("redis://***@r:6379/0");
    expect(
      redactConnectionString("https://h/hook?api_key=canary-k&x=1&access_token=canary-t&sig=canary-s"),
    ).toBe("https://h/hook?api_key=***&x=1&access_token=***&sig=***");
  });
  it("redacts strings that do not parse as URLs", () => {
    expect(redactConnectionString("postgres://u:canary pw@@ host/db password=canary")).not.toContain(
      "canary",
    );
  });
  it("replaces known secrets in free text", () => {
    registerSecrets("canary-pw");
    expect(scrubSecrets("auth failed for canary-pw")).toBe("auth failed for ***");
  });
});

describe("secret registry and scrubSecrets", () => {
  it("masks every URL's user info and sensitive query values in free text, whatever the scheme", () => {
    expect(
      scrubSecrets(
        "connect nats://canaryA@h:4222 and amqp://u:canaryB@h, then GET https://h/x?token=canaryC&page=2",
      ),
    ).toBe("connect nats://***@h:4222 and amqp://***@h, then GET https://h/x?token=***&page=2");
    expect(scrubSecrets("host=db password=canaryD dbname=x")).toBe("host=db password=*** dbname=x");
    // The last "@" of the authority ends the user info; a path or a space ends the authority.
    expect(scrubSecrets("postgres://u:p@canaryE@h/db?x=a@b")).toBe("postgres://***@h/db?x=a@b");
    expect(scrubSecrets("see https://example.test/a@b, mail ops@example.test")).toBe(
      "see https://example.test/a@b, mail ops@example.test",
    );
  });

  it("masks registered URL credentials wherever they appear, raw and percent-decoded", () => {
    registerUrlSecrets("nats://canary%2Ftok1@127.0.0.1:4222");
    registerUrlSecrets("postgres://app:canary%40pw2@db/x?sslpassword=canary-ssl3");
    registerUrlSecrets("https://h/x?api_key=canary+key4&page=12345");
    const text =
      "token canary/tok1 (canary%2Ftok1) pw canary@pw2 (canary%40pw2) ssl canary-ssl3 key canary key4 page 12345";
    expect(scrubSecrets(text)).toBe("token *** (***) pw *** (***) ssl *** key *** page 12345");
  });

  it("does not register user names, too short strings or non-URLs", () => {
    registerUrlSecrets("postgres://postgres@db/x");
    registerUrlSecrets("amqp://guest@h");
    registerUrlSecrets("not a url");
    registerSecrets("abc", "", undefined, null);
    expect(scrubSecrets("embedded postgres as guest: abc")).toBe("embedded postgres as guest: abc");
  });

  it("masks header values with and without their scheme word, and the longer secret first", () => {
    registerSecrets("Bearer canary-bearer-5", "canary-bearer-5-and-more");
    expect(scrubSecrets("sent Bearer canary-bearer-5; token canary-bearer-5; canary-bearer-5-and-more")).toBe(
      "sent ***; token ***; ***",
    );
  });

  it("scrubs JSON log lines as JSON: escaped secrets found, numbers untouched, still valid", () => {
    registerSecrets('canary"q\x06', "20240607");
    const line = `${JSON.stringify({ time: 1720240607123, msg: 'say canary"q\x06', err: { stack: "at nats://canaryF@h" } })}\n`;
    const out = scrubJsonLines(line);
    expect(out.endsWith("\n")).toBe(true);
    expect(JSON.parse(out)).toEqual({
      time: 1720240607123,
      msg: "say ***",
      err: { stack: "at nats://***@h" },
    });
    const clean = '{"level":30,"msg":"nothing here"}\n';
    expect(scrubJsonLines(clean)).toBe(clean);
    expect(scrubDeep({ n: 1720240607123, s: ["x 20240607"], d: new Date(0) })).toEqual({
      n: 1720240607123,
      s: ["x ***"],
      d: "1970-01-01T00:00:00.000Z",
    });
  });
});

describe("JSON syntax errors without the text", () => {
  it.each([
    ['{"relays": {"q": {"url": canary-a}}}', 1, 26],
    ['{"a": 1,}', 1, 9],
    ['{\n  "a": "canary-b\u0001"\n}', 2, 17],
    ['{"a": "canary-c', 1, 7],
    ['{"a": 1} canary-d', 1, 10],
    ["{canary: 1}", 1, 2],
    ['{"a": tru canary}', 1, 7],
    ["", 1, 1],
  ])("%j: line %i, column %i, nothing quoted", (text, line, column) => {
    expect(() => JSON.parse(text)).toThrow();
    expect(findJsonSyntaxError(text)).toMatchObject({ line, column });
    let message = "";
    try {
      parseJsonQuietly(text);
    } catch (error) {
      message = (error as Error).message;
    }
    expect(message).toContain(`at line ${line}, column ${column}`);
    expect(message).not.toMatch(/canary|tru/);
  });

  it("agrees with JSON.parse on valid text", () => {
    for (const text of ['{"a": [1, -2.5e3, true, false, null, "\\u00e9\\n"]}', " 0 ", '"x"']) {
      expect(findJsonSyntaxError(text)).toBeUndefined();
      expect(parseJsonQuietly(text)).toEqual(JSON.parse(text));
    }
  });
});
