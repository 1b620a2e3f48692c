import { CloudEvent, HTTP } from "cloudevents";
import fc from "fast-check";
import { Kysely, PostgresDialect, sql, type Transaction } from "kysely";
import type pg from "pg";
import { Webhook } from "standardwebhooks";
import { beforeAll, describe, expect, it } from "vitest";
import { OutboxConfigError } from "../../src/contract/errors.js";
import { decodeHttpEvent } from "../../src/inbox/http-event.js";
import {
  createInbox,
  handleWithKysely,
  type InboxEvent,
  MalformedEventError,
} from "../../src/inbox/index.js";
import { defaultEventSource } from "../../src/relay/cloudevents.js";
import { httpRelayHeaders } from "../../src/relay/http.js";
import { decodeHeaderValue, encodeHeaderValue } from "../../src/wire/header-encoding.js";
import { signingKey, verifyWebhookSignature, webhookSignature } from "../../src/wire/webhook-signature.js";
import { testDatabase } from "../support/database.js";
import { fakeMessage } from "../support/message.js";
import { until } from "../support/worker.js";

// The consumer inbox on a real Postgres (no relay here: test/inbox/inbox-relays.test.ts sends real deliveries):
// one transaction for record and effect, duplicates commit nothing, concurrent duplicates wait, expiry in
// batches; and the pure parts it stands on: Standard Webhooks verification and the binding's encoding.

const db = testDatabase("inbox");
const schema = db.freshSchema("c");
const SOURCE = "/outbox/test/outbox";

function inbox(consumer = "billing", extra: { retentionMs?: number } = {}) {
  return createInbox<pg.PoolClient>({ pool: db.pool, consumer, schema, table: "inbox", ...extra });
}

/** The effect table: no unique key, so an effect applied twice shows as two rows. */
const effects = `"${schema}".effects`;
async function effectRows(eventId: string): Promise<number> {
  const { rows } = await db.pool.query(`SELECT count(*)::int AS n FROM ${effects} WHERE event_id = $1`, [
    eventId,
  ]);
  return rows[0].n;
}
async function records(eventId: string): Promise<number> {
  const { rows } = await db.pool.query(
    `SELECT count(*)::int AS n FROM "${schema}".inbox WHERE event_id = $1`,
    [eventId],
  );
  return rows[0].n;
}
const applyEffect = async (event: { id: string }, client: pg.PoolClient) => {
  await client.query(`INSERT INTO ${effects} (event_id) VALUES ($1)`, [event.id]);
  return "applied";
};

beforeAll(async () => {
  await inbox().install();
  await inbox().install(); // idempotent
  await db.pool.query(`CREATE TABLE ${effects} (event_id text NOT NULL)`);
});

describe("inbox.handle", () => {
  it("runs the handler once per (source, id): a second delivery is a duplicate that commits nothing", async () => {
    const first = await inbox().handle({ id: "1", source: SOURCE }, applyEffect);
    expect(first).toEqual({ duplicate: false, result: "applied" });
    let ran = false;
    const second = await inbox().handle({ id: "1", source: SOURCE }, async (event, client) => {
      ran = true;
      return applyEffect(event, client);
    });
    expect(second).toEqual({ duplicate: true });
    expect(ran).toBe(false);
    expect(await effectRows("1")).toBe(1);
    expect(await records("1")).toBe(1);
  });

  it("keys by source too: the same id from another outbox is another event; another consumer has its own records", async () => {
    await inbox().handle({ id: "2", source: SOURCE }, applyEffect);
    expect(await inbox().handle({ id: "2", source: "/outbox/other/outbox" }, applyEffect)).toMatchObject({
      duplicate: false,
    });
    expect(await inbox("email").handle({ id: "2", source: SOURCE }, applyEffect)).toMatchObject({
      duplicate: false,
    });
    expect(await effectRows("2")).toBe(3);
  });

  it("a handler that throws rolls back its effect and the record, and rethrows; the redelivery runs it", async () => {
    const failure = new Error("downstream said no");
    await expect(
      inbox().handle({ id: "3", source: SOURCE }, async (event, client) => {
        await applyEffect(event, client);
        throw failure;
      }),
    ).rejects.toBe(failure);
    expect(await effectRows("3")).toBe(0);
    expect(await records("3")).toBe(0);
    expect(await inbox().handle({ id: "3", source: SOURCE }, applyEffect)).toMatchObject({
      duplicate: false,
    });
    expect(await effectRows("3")).toBe(1);
  });

  it("concurrent duplicates: the second waits on the first's uncommitted record, then finds it (or runs, after a rollback)", async () => {
    for (const firstCommits of [true, false]) {
      const id = firstCommits ? "4" : "5";
      let release!: () => void;
      const gate = new Promise<void>((resolve) => {
        release = resolve;
      });
      let firstInHandler = false;
      const first = inbox().handle({ id, source: SOURCE }, async (event, client) => {
        await applyEffect(event, client);
        firstInHandler = true;
        await gate;
        if (!firstCommits) throw new Error("first delivery fails");
        return "first";
      });
      await until(() => firstInHandler, "the first delivery in its handler");
      const second = inbox().handle({ id, source: SOURCE }, async (event, client) => {
        await applyEffect(event, client);
        return "second";
      });
      // The second delivery's INSERT is blocked on the first's uncommitted key, not finished.
      const waiting = until(async () => {
        const { rows } = await db.pool.query(
          `SELECT count(*)::int AS n FROM pg_stat_activity
           WHERE wait_event_type = 'Lock' AND query LIKE 'INSERT INTO "${schema}"."inbox"%'`,
        );
        return rows[0].n > 0;
      }, "the second delivery waiting on the first's record");
      // Released even when the wait fails, so the first delivery's client goes back to the pool.
      await waiting.finally(release);
      const outcomes = await Promise.allSettled([first, second]);
      if (firstCommits) {
        expect(outcomes.map((o) => (o.status === "fulfilled" ? o.value : "rejected"))).toEqual([
          { duplicate: false, result: "first" },
          { duplicate: true },
        ]);
      } else {
        expect(outcomes[0]?.status).toBe("rejected");
        expect(outcomes[1]).toEqual({ status: "fulfilled", value: { duplicate: false, result: "second" } });
      }
      expect(await effectRows(id)).toBe(1);
    }
  });

  it("refuses an event without id or source before any SQL", async () => {
    await expect(inbox().handle({ id: "", source: SOURCE }, applyEffect)).rejects.toThrow(/event\.id/);
    await expect(
      inbox().handle({ id: "6" } as unknown as { id: string; source: string }, applyEffect),
    ).rejects.toThrow(/event\.source/);
  });
});

describe("handleWithKysely", () => {
  it("commits the record with the handler's writes on the Kysely transaction; a duplicate commits nothing; a throw rolls back", async () => {
    const db2 = new Kysely<Record<string, never>>({ dialect: new PostgresDialect({ pool: db.pool }) });
    const write = async (event: { id: string }, trx: Transaction<Record<string, never>>) => {
      await sql`INSERT INTO ${sql.raw(effects)} (event_id) VALUES (${event.id})`.execute(trx);
      return "applied";
    };
    await expect(
      handleWithKysely(inbox(), db2, { id: "k1", source: SOURCE }, async (event, trx) => {
        await write(event, trx);
        throw new Error("no");
      }),
    ).rejects.toThrow("no");
    expect([await effectRows("k1"), await records("k1")]).toEqual([0, 0]);
    expect(await handleWithKysely(inbox(), db2, { id: "k1", source: SOURCE }, write)).toEqual({
      duplicate: false,
      result: "applied",
    });
    expect(await handleWithKysely(inbox(), db2, { id: "k1", source: SOURCE }, write)).toEqual({
      duplicate: true,
    });
    // The pg form and the Kysely form share the records.
    expect(await inbox().handle({ id: "k1", source: SOURCE }, applyEffect)).toEqual({ duplicate: true });
    expect([await effectRows("k1"), await records("k1")]).toEqual([1, 1]);
  });
});

describe("inbox retention", () => {
  it("expires this consumer's records older than the retention, in batches, and no others", async () => {
    const box = inbox("retention", { retentionMs: 3_600_000 });
    for (let i = 0; i < 5; i++) await box.handle({ id: `old-${i}`, source: SOURCE }, () => undefined);
    await box.handle({ id: "recent", source: SOURCE }, () => undefined);
    await inbox("other-consumer").handle({ id: "old-0", source: SOURCE }, () => undefined);
    await db.pool.query(
      `UPDATE "${schema}".inbox SET received_at = now() - interval '2 hours' WHERE event_id LIKE 'old-%'`,
    );
    expect(await box.expire({ batchSize: 2 })).toEqual({ deleted: 5, batches: 3 });
    const { rows } = await db.pool.query(
      `SELECT consumer, event_id FROM "${schema}".inbox WHERE consumer IN ('retention', 'other-consumer') ORDER BY 1, 2`,
    );
    expect(rows).toEqual([
      { consumer: "other-consumer", event_id: "old-0" },
      { consumer: "retention", event_id: "recent" },
    ]);
    // The expired event is new again: the retention is the window the dedupe covers.
    expect(await box.handle({ id: "old-1", source: SOURCE }, () => "again")).toEqual({
      duplicate: false,
      result: "again",
    });
  });

  it("startExpiry runs expire on its interval until stopped", async () => {
    const box = inbox("timer", { retentionMs: 60_000 });
    await box.handle({ id: "t", source: SOURCE }, () => undefined);
    await db.pool.query(
      `UPDATE "${schema}".inbox SET received_at = now() - interval '1 hour' WHERE consumer = 'timer'`,
    );
    const timer = box.startExpiry({ intervalMs: 20 });
    try {
      await until(async () => (await records("t")) === 0, "the timer's expiry");
    } finally {
      await timer.stop();
    }
  });
});

describe("inbox options", () => {
  it("names the field and the reason", () => {
    const bad = (options: Record<string, unknown>) => {
      try {
        createInbox({ pool: db.pool, consumer: "c", ...options } as never);
      } catch (error) {
        expect(error).toBeInstanceOf(OutboxConfigError);
        return (error as Error).message;
      }
      throw new Error("accepted");
    };
    expect(bad({ table: 'x"; DROP TABLE y; --' })).toMatch(/inbox\.table: must be a plain identifier/);
    expect(bad({ schema: "pg_catalog" })).toMatch(/inbox\.schema: .*pg_/);
    expect(bad({ consumer: "" })).toMatch(/inbox\.consumer: must name the consumer/);
    expect(bad({ retentionMs: 1000 })).toMatch(/inbox\.retentionMs: must be at least 60000/);
    expect(bad({ pool: "postgres://u:s3cret@h/db" })).toMatch(/inbox\.pool: must be a pg Pool/);
    expect(bad({ pool: "postgres://u:s3cret@h/db" })).not.toContain("s3cret");
  });

  it("documents its DDL: the table keyed by (consumer, source, event_id) and the retention's index", () => {
    expect(inbox().installSql).toContain(`CREATE TABLE IF NOT EXISTS "${schema}"."inbox"`);
    expect(inbox().installSql).toContain("PRIMARY KEY (consumer, source, event_id)");
    expect(createInbox({ pool: db.pool, consumer: "c" }).installSql).not.toContain("CREATE SCHEMA");
  });
});

describe("Standard Webhooks verification", () => {
  const secret = `whsec_${Buffer.alloc(32, 7).toString("base64")}`;
  const key = signingKey(secret) as Buffer;
  const now = 1_800_000_000;
  const options = { toleranceSeconds: 300, nowSeconds: now };

  it("accepts what the standardwebhooks package signs, and that package accepts what the relay signs", () => {
    const body = '{"orderId":7}';
    const signature = new Webhook(secret).sign("msg-1", new Date(now * 1000), body);
    expect(
      verifyWebhookSignature([key], { id: "msg-1", timestamp: String(now), signature }, body, options),
    ).toBeNull();
    const ours = webhookSignature([key], "msg-1", now, body);
    expect(ours).toBe(signature);
  });

  it("refuses a changed body, id or signature, a stale or future timestamp; accepts any key while rotating", () => {
    const body = "{}";
    const headers = { id: "9", timestamp: String(now), signature: webhookSignature([key], "9", now, body) };
    expect(verifyWebhookSignature([key], headers, "{ }", options)).toBe("no signature matches");
    expect(verifyWebhookSignature([key], { ...headers, id: "10" }, body, options)).toBe(
      "no signature matches",
    );
    const bytes = Buffer.from(headers.signature.slice(3), "base64");
    bytes[0] = (bytes[0] as number) ^ 1;
    const flipped = `v1,${bytes.toString("base64")}`;
    expect(verifyWebhookSignature([key], { ...headers, signature: flipped }, body, options)).toBe(
      "no signature matches",
    );
    expect(verifyWebhookSignature([key], headers, body, { ...options, nowSeconds: now + 301 })).toBe(
      "webhook-timestamp is too old",
    );
    expect(verifyWebhookSignature([key], headers, body, { ...options, nowSeconds: now - 301 })).toBe(
      "webhook-timestamp is too far in the future",
    );
    expect(verifyWebhookSignature([key], headers, body, { ...options, nowSeconds: now + 300 })).toBeNull();
    const other = Buffer.alloc(32, 8);
    expect(verifyWebhookSignature([other, key], headers, body, options)).toBeNull();
    const both = { ...headers, signature: webhookSignature([other, key], "9", now, body) };
    expect(verifyWebhookSignature([key], both, body, options)).toBeNull();
    expect(verifyWebhookSignature([key], { ...headers, signature: undefined }, body, options)).toMatch(
      /missing/,
    );
  });
});

describe("the binding's percent-encoding", () => {
  it("decodes exactly what the relays encode, for any string", () => {
    fc.assert(
      fc.property(fc.string({ unit: "grapheme", maxLength: 40 }), (value) => {
        expect(decodeHeaderValue(encodeHeaderValue(value))).toBe(value);
      }),
    );
  });

  it("a relayed request with non-ASCII and % in its attributes decodes as sent, and as the cloudevents SDK reads it", () => {
    const key = 'customer 42 ü/%41 😀 "q"';
    const message = fakeMessage({
      id: "77",
      queue: "order.placed",
      key,
      headers: { tenant: "acme %25 € ü", "x-tenant": "acme corp %" },
      rawPayload: '{"n":12345678901234567890}',
    });
    const source = defaultEventSource("postgres://u@h/shop ü", "outbox");
    const headers = Object.fromEntries(httpRelayHeaders(message, { source, type: "{queue}" }, undefined));
    const event = decodeHttpEvent(headers, message.rawPayload);
    expect(event).toMatchObject({
      id: "77",
      source,
      type: "order.placed",
      subject: key,
      extensions: { tenant: "acme %25 € ü" },
      headers: { "x-tenant": "acme corp %" },
      data: '{"n":12345678901234567890}',
    });
    // The SDK leaves the percent-encoding in place: undone, its attributes are ours.
    const sdk = HTTP.toEvent({ headers, body: message.rawPayload }) as CloudEvent<unknown>;
    for (const name of ["id", "source", "type", "subject", "tenant"]) {
      expect(decodeURIComponent(String((sdk as unknown as Record<string, unknown>)[name])), name).toBe(
        name === "tenant" ? event.extensions.tenant : event[name as keyof InboxEvent],
      );
    }
  });

  it("reads the SDK's structured and binary modes, and refuses what is no CloudEvent (naming the field)", () => {
    const ce = new CloudEvent({ id: "s1", source: "/x", type: "t", subject: "ü", data: { a: 1 } });
    const structured = HTTP.structured(ce);
    expect(decodeHttpEvent(structured.headers, structured.body as string)).toMatchObject({
      id: "s1",
      subject: "ü",
      payload: { a: 1 },
    });
    const binary = HTTP.binary(new CloudEvent({ id: "b1", source: "/x", type: "t", data: { a: 2 } }));
    expect(decodeHttpEvent(binary.headers, binary.body as string)).toMatchObject({
      id: "b1",
      payload: { a: 2 },
    });
    const malformed = (headers: Record<string, string>, body = "{}") => {
      try {
        decodeHttpEvent(headers, body);
      } catch (error) {
        expect(error).toBeInstanceOf(MalformedEventError);
        return (error as MalformedEventError).field;
      }
      return "accepted";
    };
    const ok = { "ce-specversion": "1.0", "ce-id": "1", "ce-source": "/s", "ce-type": "t" };
    expect(malformed(ok)).toBe("accepted");
    expect(malformed({ ...ok, "ce-id": "" })).toBe("id");
    expect(malformed({ ...ok, "ce-subject": "100%" })).toBe("ce-subject");
    expect(malformed({ ...ok, "content-type": "application/json" }, "{not json")).toBe("data");
    expect(malformed({ "content-type": "application/json" })).toBe("ce-specversion");
  });
});
