import { createRequire } from "node:module";
import path from "node:path";
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { OutboxPayloadError } from "../../src/contract/errors.js";
import { prepareMessage } from "../../src/contract/prepare-message.js";
import { cloudEventAttributes } from "../../src/relay/cloudevents.js";
import { httpRelayHeaders } from "../../src/relay/http.js";
import { natsEventHeaders } from "../../src/relay/nats.js";
import { rabbitmqEventHeaders } from "../../src/relay/rabbitmq.js";
import { fakeMessage } from "../support/message.js";

/**
 * Publish refuses the headers some relay's transport cannot carry (and Postgres cannot store), no more, so
 * a relay never dead-letters a message for a header publish accepted (the HTTP relay's own policy aside:
 * names it reserves, such as `content-*`, stay its refusals).
 */

// amqplib's own field-table encoder (not exported: reached by its file), which the RabbitMQ relay's publish runs.
const require = createRequire(import.meta.url);
const { encodeTable } = require(path.join(path.dirname(require.resolve("amqplib")), "lib/codec.js")) as {
  encodeTable(buffer: Buffer, table: Record<string, unknown>, offset: number): number;
};

const naming = { source: "/outbox", type: "{queue}" };
const NOT_A_TOKEN = "not a valid HTTP header name";

/** Characters around every rule's edge: token characters, separators, line breaks, NUL, non-ASCII, halves. */
const unit = fc.constantFrom(
  ..."aZ09-_.!~|`^'*+#$%&",
  ...' :;,"()/<>=?@[]{}\\\t\r\n\0\x7f',
  "é",
  "😀",
  "\uD800",
  "\uDC00",
);
const name = fc.oneof(
  fc.string({ unit, maxLength: 12 }),
  fc.string({ unit: fc.constantFrom("x", "-"), minLength: 250, maxLength: 260 }),
);
const value = fc.string({ unit, maxLength: 12 });

/** Whether publish accepts these headers (on a message that is otherwise fine). */
function publishAccepts(headers: Record<string, string>): boolean {
  try {
    prepareMessage("q", {}, { headers }, 1024);
    return true;
  } catch (error) {
    if (error instanceof OutboxPayloadError && error.field?.startsWith("headers")) return false;
    throw error;
  }
}

function relayRefusals(headers: Record<string, string>): string[] {
  const message = fakeMessage({ id: "1", queue: "q", headers });
  const refused: string[] = [];
  try {
    httpRelayHeaders(message, naming, undefined);
  } catch (error) {
    if ((error as Error).message.includes(NOT_A_TOKEN)) refused.push(`http: ${(error as Error).message}`);
  }
  try {
    natsEventHeaders(message, naming); // nats.js checks each name and value as it is added
  } catch (error) {
    refused.push(`nats: ${(error as Error).message}`);
  }
  try {
    encodeTable(
      Buffer.alloc(64 * 1024),
      rabbitmqEventHeaders(message, cloudEventAttributes(message, naming)),
      0,
    );
  } catch (error) {
    refused.push(`rabbitmq: ${(error as Error).message}`);
  }
  return refused;
}

describe("publish and the relays agree on headers", () => {
  it("every header publish accepts, every relay's transport carries", () => {
    fc.assert(
      fc.property(name, value, (n, v) => {
        fc.pre(publishAccepts({ [n]: v }));
        expect(relayRefusals({ [n]: v })).toEqual([]);
      }),
      { numRuns: 2000 },
    );
  });

  it("publish refuses no header name every transport carries", () => {
    fc.assert(
      fc.property(name, (n) => {
        fc.pre(!publishAccepts({ [n]: "v" }));
        expect(relayRefusals({ [n]: "v" })).not.toEqual([]);
      }),
      { numRuns: 2000 },
    );
  });

  it("publish refuses a header value only when a transport or Postgres cannot carry it", () => {
    // Not an attribute name: its value goes as it is, not percent-encoded. (Line breaks are refused in
    // every header's value, though the relays percent-encode those of CloudEvents attributes.)
    fc.assert(
      fc.property(value, (v) => {
        fc.pre(!publishAccepts({ "x-v": v }));
        const postgresRefuses = v.includes("\0") || v !== Buffer.from(v).toString();
        if (!postgresRefuses) expect(relayRefusals({ "x-v": v })).not.toEqual([]);
      }),
      { numRuns: 2000 },
    );
  });
});
