import path from "node:path";
import type { Browser, Page } from "playwright-core";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { chromiumMissing, launchChromium } from "../../scripts/support/chromium.js";
import { serviceConfigSchema } from "../../src/service/config.js";
import { type RunningService, startService } from "../../src/service/service.js";
import { testDatabase } from "../support/database.js";
import { memoryLogger } from "../support/memory-logger.js";
import { startTcpProxy, type TcpProxy } from "../support/tcp-proxy.js";

// The console at size: 100k unprocessed rows and 100k dead letters, a 1 MB payload, bidi controls, and
// the database going away under it.
const db = testDatabase("consz");
const BULK = 100_000;
const BIG_CHARS = 1_100_000;
const WRITE_TOKEN = "w-token-0123456789abcdef";
const RLO = "\u202E";
/** Every bidi control the page must neutralise. */
const BIDI = /[\u202A-\u202E\u2066-\u2069\u200E\u200F\u061C]/;
const RTL_QUEUE = `rtl${RLO}eueuq`;
/** Hang guard for the tests that walk 100k rows: minutes on a busy 2-core machine (no time is asserted). */
const LONG = 600_000;
let bigMessage: string;
let bigDead: string;

beforeAll(async () => {
  await db.migrate();
  const { messages, deadLetters } = db.names;
  // The 1 MB message has the lowest id of its queue (first on the first page, oldest first) ...
  const big = await db.pool.query<{ id: string }>(
    `INSERT INTO ${messages} (queue, payload) VALUES ('bulk', jsonb_build_object('blob', repeat('x', $1::int)))
     RETURNING id`,
    [BIG_CHARS],
  );
  bigMessage = big.rows[0]?.id as string;
  await db.pool.query(
    `INSERT INTO ${messages} (queue, payload)
     SELECT 'bulk', jsonb_build_object('n', i) FROM generate_series(1, $1::int) AS i`,
    [BULK],
  );
  await db.pool.query(
    `INSERT INTO ${deadLetters} (id, queue, payload, headers, created_at, available_at, acquired_by,
       deliveries_count, attempts_count, failures_count, dead_at, reason, error)
     SELECT nextval(pg_get_serial_sequence($1, 'id')), 'bulk', jsonb_build_object('n', i), '{}', now(), now(),
       'worker-z', 1, 1, 1, now(), 'rejected', 'boom ' || i
     FROM generate_series(1, $2::int) AS i`,
    [messages, BULK],
  );
  // ... and the 1 MB dead letter the highest id (first on the first page, newest first).
  const bigDeadRow = await db.pool.query<{ id: string }>(
    `INSERT INTO ${deadLetters} (id, queue, payload, headers, created_at, available_at, deliveries_count,
       attempts_count, failures_count, dead_at, reason, error)
     VALUES (nextval(pg_get_serial_sequence($1, 'id')), 'bulk', jsonb_build_object('blob', repeat('y', $2::int)),
       '{}', now(), now(), 1, 1, 1, now(), 'rejected', repeat('e', 5000))
     RETURNING id`,
    [messages, BIG_CHARS],
  );
  bigDead = bigDeadRow.rows[0]?.id as string;
  // Bidi controls in a queue name, a payload, a last error and a dead letter's error.
  await db.pool.query(
    `INSERT INTO ${messages} (queue, payload, last_error) VALUES
       ($1, jsonb_build_object('file', $2::text), $3),
       ('rtl', jsonb_build_object('file', $2::text), $3)`,
    [RTL_QUEUE, `invoice${RLO}fdp.exe`, `failed \u2067isolated\u2069 \u200Fmark\u061C`],
  );
  await db.pool.query(
    `INSERT INTO ${deadLetters} (id, queue, payload, headers, created_at, available_at, deliveries_count,
       attempts_count, failures_count, dead_at, reason, error)
     VALUES (nextval(pg_get_serial_sequence($1, 'id')), 'rtl', jsonb_build_object('file', $2::text), '{}',
       now(), now(), 1, 1, 1, now(), 'rejected', $3)`,
    [messages, `\u202Breport${RLO}cod.exe`, `boom \u202Aleft\u202C`],
  );
});

const running: RunningService[] = [];
const proxies: TcpProxy[] = [];
afterEach(async () => {
  for (const service of running.splice(0)) await service.stop();
  for (const proxy of proxies.splice(0)) await proxy.close();
});

/** The service with the console on; the seeded queues have no handler, so nothing moves by itself. */
async function serve(databaseUrl = db.url) {
  const config = serviceConfigSchema.parse({
    databaseUrl,
    schema: db.schema,
    handlers: path.resolve("test/support/fixtures/handlers.ts"),
    http: { port: 0 },
    console: { enabled: true, writeToken: WRITE_TOKEN },
  });
  const service = await startService(config, memoryLogger().logger);
  running.push(service);
  return `http://127.0.0.1:${service.httpPort}/console`;
}

async function get(url: string) {
  const res = await fetch(url);
  return { status: res.status, headers: res.headers, text: await res.text() };
}

interface ListRow {
  id: string;
  payload_preview: string;
  payload_bytes: number;
  payload_truncated: boolean;
}

describe("console API at size", () => {
  it(
    "pages 100k unprocessed rows and 100k dead letters by id: every row once, in order",
    async () => {
      const console = await serve();
      for (const [list, param, order] of [
        ["peek", "after", 1n],
        ["dead-letters", "before", -1n],
      ] as const) {
        let cursor: string | null = null;
        let previous: bigint | undefined;
        let seen = 0;
        let pages = 0;
        do {
          const query: string = `queue=bulk&limit=1000${cursor ? `&${param}=${cursor}` : ""}`;
          const res = await get(`${console}/api/${list}?${query}`);
          expect(res.status, query).toBe(200);
          const page = JSON.parse(res.text) as { rows: ListRow[]; next: string | null };
          for (const row of page.rows) {
            const id = BigInt(row.id);
            if (previous !== undefined) expect((id - previous) * order > 0n, `${list} ${row.id}`).toBe(true);
            previous = id;
          }
          seen += page.rows.length;
          pages++;
          cursor = page.next;
          if (cursor !== null) expect(cursor).toBe(page.rows[page.rows.length - 1]?.id);
          // A cursor that does not move on would page forever: stop well past the expected 101 pages.
        } while (cursor !== null && pages < 150);
        expect(seen, list).toBe(BULK + 1);
        expect(pages, list).toBe(101);
      }
      const bad = await get(`${console}/api/peek?after=abc`);
      expect(bad.status).toBe(400);
      expect(JSON.parse(bad.text).error).toMatch(/^after: must be a positive whole number/);
      expect((await get(`${console}/api/dead-letters?before=-1`)).status).toBe(400);
    },
    LONG,
  );

  it("sends list rows with a bounded preview, and the whole row only when asked for", async () => {
    const console = await serve();
    for (const [list, bigId] of [
      ["peek", bigMessage],
      ["dead-letters", bigDead],
    ] as const) {
      const res = await get(`${console}/api/${list}?queue=bulk&limit=50`);
      // 50 rows, one of them 1 MB: the answer stays small, on every poll.
      expect(res.text.length, list).toBeLessThan(32 * 1024);
      const page = JSON.parse(res.text) as { rows: ListRow[] };
      expect(page.rows).toHaveLength(50);
      const big = page.rows[0] as ListRow & { error?: string; error_truncated?: boolean };
      expect(big.id).toBe(bigId);
      expect(big.payload_truncated).toBe(true);
      expect(big.payload_bytes).toBeGreaterThan(BIG_CHARS);
      expect(big.payload_preview).toHaveLength(200);
      expect(big.payload_preview.startsWith('{"blob": "')).toBe(true);
      if (list === "dead-letters")
        expect(big).toMatchObject({ error: "e".repeat(200), error_truncated: true });
      const small = page.rows[1] as ListRow;
      expect(small.payload_truncated).toBe(false);
      expect(JSON.parse(small.payload_preview)).toEqual({ n: expect.any(Number) });
    }
    const whole = JSON.parse((await get(`${console}/api/messages/${bigMessage}`)).text);
    expect(whole.payload.blob).toHaveLength(BIG_CHARS);
    const wholeDead = JSON.parse((await get(`${console}/api/dead-letters/${bigDead}`)).text);
    expect(wholeDead.payload.blob).toHaveLength(BIG_CHARS);
    expect(wholeDead.error).toHaveLength(5000);
  });

  it("answers 503 naming the database while it is down, and serves again once it is back", async () => {
    const target = new URL(db.url);
    const proxy = await startTcpProxy({ host: target.hostname, port: Number(target.port || 5432) });
    proxies.push(proxy);
    const proxied = new URL(db.url);
    proxied.host = `127.0.0.1:${proxy.port}`;
    const console = await serve(proxied.toString());
    expect((await get(`${console}/api/status`)).status).toBe(200);

    proxy.cut();
    const database = `database ${JSON.stringify(target.pathname.slice(1))} at 127.0.0.1:${proxy.port}`;
    for (const p of [
      "/api/status",
      "/api/peek?queue=bulk",
      "/api/dead-letters",
      `/api/messages/${bigMessage}`,
    ]) {
      const res = await get(`${console}${p}`);
      expect(res.status, p).toBe(503);
      const body = JSON.parse(res.text);
      expect(body.error, p).toMatch(
        new RegExp(`^${database.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")} is unavailable \\(`),
      );
      expect(body.database, p).toBe(database);
      expect(res.headers.get("content-security-policy"), p).toContain("default-src 'none'");
      expect(res.headers.get("retry-after"), p).toBe("5");
      // No credential, no driver text.
      expect(res.text, p).not.toMatch(/postgres(ql)?:\/\/|@|password/i);
    }

    proxy.restore();
    await expect.poll(async () => (await get(`${console}/api/status`)).status).toBe(200);
  });
});

const missing = chromiumMissing();
if (missing) console.warn(`console-size.test: the browser tests are skipped: ${missing}`);

describe.skipIf(missing !== undefined)("console at size in a headless Chromium", () => {
  let browser: Browser;
  beforeAll(async () => {
    browser = await launchChromium();
  });
  afterAll(() => browser?.close());

  async function open(
    console: string,
  ): Promise<{ page: Page; errors: string[]; sizes: Map<string, number[]> }> {
    const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
    const errors: string[] = [];
    page.on("console", (m) => {
      if (m.type() === "error") errors.push(`console: ${m.text()}`);
    });
    page.on("pageerror", (e) => errors.push(`pageerror: ${e.message}`));
    // Bytes of each API answer, by endpoint.
    const sizes = new Map<string, number[]>();
    page.on("response", async (res) => {
      const url = new URL(res.url());
      if (!url.pathname.includes("/api/")) return;
      const body = await res.body().catch(() => undefined);
      if (!body) return;
      const key = url.pathname.replace(/\/\d+$/, "/<id>");
      sizes.set(key, [...(sizes.get(key) ?? []), body.length]);
    });
    await page.goto(`${console}/`);
    return { page, errors, sizes };
  }

  const idsOf = (page: Page, table: string) =>
    page
      .locator(`#${table} tbody tr[data-id]`)
      .evaluateAll((rows) => rows.map((r) => r.getAttribute("data-id")));

  it(
    "pages both lists by id with Next, Previous and First, each poll a small answer though a row is 1 MB",
    async () => {
      const console = await serve();
      const { page, errors, sizes } = await open(console);
      try {
        await page.fill("#peek-queue", "bulk");
        await page.press("#peek-queue", "Enter");
        await page.fill("#dead-queue", "bulk");
        await page.press("#dead-queue", "Enter");
        await expect.poll(async () => (await idsOf(page, "peek"))[0]).toBe(bigMessage);
        await expect.poll(async () => (await idsOf(page, "dead"))[0]).toBe(bigDead);

        for (const [table, first, older] of [
          ["peek", bigMessage, 1n],
          ["dead", bigDead, -1n],
        ] as const) {
          const page1 = (await idsOf(page, table)) as string[];
          expect(page1).toHaveLength(50);
          expect(await page.locator(`#${table}-page`).textContent()).toBe(
            `page 1: ids ${page1[0]} to ${page1[49]}`,
          );
          expect(await page.locator(`#${table}-prev`).isDisabled()).toBe(true);
          const pages = [page1];
          for (let n = 2; n <= 4; n++) {
            const before = pages[pages.length - 1] as string[];
            await page.click(`#${table}-next`);
            await expect.poll(async () => (await idsOf(page, table))[0]).not.toBe(before[0]);
            const shown = (await idsOf(page, table)) as string[];
            expect(shown).toHaveLength(50);
            // Right after the page before: the next ids in order, none repeated, none skipped.
            expect((BigInt(shown[0] as string) - BigInt(before[49] as string)) * older).toBe(1n);
            expect(await page.locator(`#${table}-page`).textContent()).toMatch(new RegExp(`^page ${n}: `));
            pages.push(shown);
          }
          await page.click(`#${table}-prev`);
          await expect.poll(() => idsOf(page, table)).toEqual(pages[2]);
          await page.click(`#${table}-first`);
          await expect.poll(() => idsOf(page, table)).toEqual(page1);
          expect(page1[0]).toBe(first);
        }

        // The big row's preview is cut, and says by how much; a few polls later, no answer was large.
        const payload = await page
          .locator(`#peek tr[data-id="${bigMessage}"] td[data-col="payload"]`)
          .textContent();
        expect(payload).toMatch(/^\{"blob": "x+… \(1\.0 MB in all: View\)$/);
        const polls = () => sizes.get("/console/api/peek")?.length ?? 0;
        const seen = polls();
        await expect.poll(polls).toBeGreaterThanOrEqual(seen + 2);
        for (const endpoint of ["/console/api/peek", "/console/api/dead-letters", "/console/api/status"]) {
          const answers = sizes.get(endpoint) ?? [];
          expect(answers.length, endpoint).toBeGreaterThan(0);
          expect(Math.max(...answers), endpoint).toBeLessThan(64 * 1024);
        }

        // View: the whole record, once, beside its row.
        await page.locator(`#peek tr[data-id="${bigMessage}"] button[data-action="view"]`).click();
        await expect
          .poll(async () => (await page.locator("#detail-body").textContent())?.length ?? 0)
          .toBeGreaterThan(BIG_CHARS);
        // Polled: a list poll re-rendering the rows takes the box out and puts it back beside its row.
        await expect.poll(() => boxRowAfter(page, "detail")).toBe(bigMessage);
        expect(Math.max(...(sizes.get("/console/api/messages/<id>") ?? [0]))).toBeGreaterThan(BIG_CHARS);
        expect(errors).toEqual([]);
      } finally {
        await page.close();
      }
    },
    LONG,
  );

  it("shows every bidi control as a visible mark, in every cell and in the full record", async () => {
    const console = await serve();
    const { page, errors } = await open(console);
    try {
      await page.fill("#peek-queue", "rtl");
      await page.press("#peek-queue", "Enter");
      await page.fill("#dead-queue", "rtl");
      await page.press("#dead-queue", "Enter");
      const peekRow = page.locator("#peek tbody tr[data-id]");
      await expect.poll(() => peekRow.count()).toBe(1);
      await expect.poll(() => page.locator("#dead tbody tr[data-id]").count()).toBe(1);
      expect(await peekRow.locator('td[data-col="payload"]').textContent()).toBe(
        '{"file": "invoice[U+202E]fdp.exe"}',
      );
      expect(await peekRow.locator('td[data-col="last_error"]').textContent()).toBe(
        "failed [U+2067]isolated[U+2069] [U+200F]mark[U+061C]",
      );
      const dead = page.locator("#dead tbody tr[data-id]");
      expect(await dead.locator('td[data-col="payload"]').textContent()).toBe(
        '{"file": "[U+202B]report[U+202E]cod.exe"}',
      );
      expect(await dead.locator('td[data-col="error"]').textContent()).toBe("boom [U+202A]left[U+202C]");
      expect(await page.locator("#queues td[data-col='queue']").allTextContents()).toContain(
        "rtl[U+202E]eueuq",
      );
      await dead.locator('button[data-action="view"]').click();
      await expect
        .poll(() => page.locator("#detail-body").textContent())
        .toContain("[U+202B]report[U+202E]cod.exe");

      // Nothing on the page holds a bidi control any more: no cell can be reordered by one.
      const text = await page.locator("body").textContent();
      expect(text).not.toMatch(BIDI);
      expect(errors).toEqual([]);
    } finally {
      await page.close();
    }
  });

  it(
    "opens each confirmation and notice beside the row or form it is about, and keeps it there across polls",
    async () => {
      const console = await serve();
      const { page, errors, sizes } = await open(console);
      try {
        await page.fill("#token", WRITE_TOKEN);
        await page.click("#token-save");
        await page.fill("#dead-queue", "bulk");
        await page.press("#dead-queue", "Enter");
        await expect.poll(async () => (await idsOf(page, "dead"))[0]).toBe(bigDead);
        const first = (await idsOf(page, "dead")) as string[];
        await page.click("#dead-next");
        await expect.poll(async () => (await idsOf(page, "dead"))[0]).not.toBe(first[0]);
        const shown = (await idsOf(page, "dead")) as string[];
        const target = shown[40] as string;
        const button = page.locator(`#dead tr[data-id="${target}"] button[data-action="replay"]`);
        await expect.poll(() => button.isEnabled()).toBe(true);
        await button.click();
        await expect
          .poll(() => page.locator("#confirm-text").textContent())
          .toMatch(/This will replay 1 dead letter into/);
        await expect.poll(() => boxRowAfter(page, "confirm")).toBe(target);
        await expectBeside(page, `#dead tr[data-id="${target}"]`, "#confirm");

        // Still there after the list was rendered again by a poll.
        const polls = sizes.get("/console/api/dead-letters")?.length ?? 0;
        await expect
          .poll(() => sizes.get("/console/api/dead-letters")?.length ?? 0)
          .toBeGreaterThanOrEqual(polls + 2);
        await expect.poll(() => boxRowAfter(page, "confirm")).toBe(target);
        await expectBeside(page, `#dead tr[data-id="${target}"]`, "#confirm");

        await page.click("#confirm-yes");
        await expect.poll(() => page.locator("#notice").textContent()).toBe("Replayed 1 dead letter.");
        // The row is gone; the notice stands where it was: right after the row that was above it.
        await expect.poll(() => page.locator(`#dead tr[data-id="${target}"]`).count()).toBe(0);
        await expect.poll(() => boxRowAfter(page, "notice")).toBe(shown[39]);
        expect(await page.locator("#confirm").isVisible()).toBe(false);

        // A form's button: the notice right after its form.
        await page.fill("#purge-older", "30d");
        await page.click('#purge-form button[type="submit"]');
        await expect
          .poll(() => page.locator("#notice").textContent())
          .toBe("No dead letter is older than 30d.");
        expect(await page.locator("#purge-form + #notice").count()).toBe(1);
        await expectBeside(page, "#purge-form", "#notice");
        expect(errors).toEqual([]);
      } finally {
        await page.close();
      }
    },
    LONG,
  );
});

/** The data-id of the row right above the box's own row (a box sits in a row of its own). */
async function boxRowAfter(page: Page, box: string): Promise<string | null> {
  const holder = page.locator(`tr[data-box]:has(#${box})`);
  if ((await holder.count()) !== 1) return null;
  return holder.evaluate((tr) => tr.previousElementSibling?.getAttribute("data-id") ?? null);
}

/** The box starts where the anchor ends (a few pixels apart), and both are on screen together. */
async function expectBeside(page: Page, anchor: string, box: string): Promise<void> {
  await page.locator(box).scrollIntoViewIfNeeded();
  const a = await page.locator(anchor).boundingBox();
  const b = await page.locator(box).boundingBox();
  expect(a && b).toBeTruthy();
  if (!a || !b) return;
  const gap = b.y - (a.y + a.height);
  expect(gap).toBeGreaterThanOrEqual(-1);
  expect(gap).toBeLessThan(24);
  const viewport = page.viewportSize() as { height: number };
  expect(a.y).toBeGreaterThanOrEqual(-1);
  expect(b.y + Math.min(b.height, 40)).toBeLessThanOrEqual(viewport.height + 1);
}
