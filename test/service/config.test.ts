import { writeFile } from "node:fs/promises";
import path from "node:path";
import { describe, expect, it } from "vitest";
import { ConfigError, configFields, loadServiceConfig } from "../../src/service/config.js";
import { renderConfigTable } from "../../src/service/config-table.js";
import { prettyLine } from "../../src/service/logger.js";
import { readDoc } from "../support/docs.js";
import { testTempDir } from "../support/temp-dir.js";

async function problems(options: Parameters<typeof loadServiceConfig>[0]): Promise<string[]> {
  try {
    await loadServiceConfig(options);
  } catch (error) {
    if (error instanceof ConfigError) return error.problems;
    throw error;
  }
  throw new Error("expected a ConfigError");
}

describe("service config", () => {
  it("has defaults for everything but the database", async () => {
    const config = await loadServiceConfig({ env: {} });
    expect(config).toMatchObject({
      schema: "outbox",
      migrate: false,
      relays: {},
      worker: { concurrency: 10, batchSize: 500, leaseTtlMs: 30_000, listen: true },
      http: { host: "127.0.0.1", gaugeIntervalMs: 5000 },
      console: { enabled: false, pathPrefix: "/console" },
      log: { level: "info" },
    });
    expect(config.databaseUrl).toBeUndefined();
    expect(config.http.port).toBeUndefined();
  });

  it("reads the environment with types, and flags override it, which overrides the file", async () => {
    const dir = await testTempDir("outbox-config-");
    const file = path.join(dir, "c.json");
    await writeFile(
      file,
      JSON.stringify({ schema: "from_file", worker: { concurrency: 3, batchSize: 7 }, http: { port: 1 } }),
    );
    const config = await loadServiceConfig({
      file,
      env: {
        OUTBOX_CONCURRENCY: "4",
        OUTBOX_LISTEN: "off",
        OUTBOX_MIGRATE: "yes",
        OUTBOX_RELAYS: JSON.stringify({ "order.placed": { type: "http", url: "http://127.0.0.1:9/hook" } }),
        OUTBOX_COMPLETION_WINDOW_MS: "0.5",
        OUTBOX_SYNCHRONOUS_COMMIT: "true",
      },
      overrides: { "http.port": 9464, schema: undefined },
    });
    expect(config.schema).toBe("from_file");
    expect(config.worker).toMatchObject({
      concurrency: 4,
      batchSize: 7,
      listen: false,
      completionWindowMs: 0.5,
      synchronousCommit: true,
    });
    expect(config.migrate).toBe(true);
    expect(config.http.port).toBe(9464);
    expect(config.relays["order.placed"]).toMatchObject({ type: "http", url: "http://127.0.0.1:9/hook" });
  });

  it("loads a JS module config (default export object or function)", async () => {
    const dir = await testTempDir("outbox-config-");
    const file = path.join(dir, "outbox.config.mjs");
    await writeFile(file, "export default () => ({ worker: { concurrency: 12 } });\n");
    expect((await loadServiceConfig({ file, env: {} })).worker.concurrency).toBe(12);
  });

  it("reports every problem at once, each with its field and environment variable", async () => {
    const found = await problems({
      env: {
        OUTBOX_BATCH_SIZE: "lots",
        OUTBOX_LISTEN: "maybe",
        OUTBOX_RELAYS: "{not json",
        OUTBOX_SCHEMA: "Bad-Name",
        OUTBOX_LEASE_TTL_MS: "10000",
        OUTBOX_HEARTBEAT_MS: "6000",
        OUTBOX_HTTP_PORT: "70000",
      },
    });
    expect(found).toEqual(
      expect.arrayContaining([
        'worker.batchSize (OUTBOX_BATCH_SIZE): expected a whole number, got "lots"',
        'worker.listen (OUTBOX_LISTEN): expected true or false, got "maybe"',
        expect.stringMatching(/^relays \(OUTBOX_RELAYS\): not valid JSON/),
      ]),
    );
    // Type errors stop the schema pass; the next run then names the cross-field ones.
    const next = await problems({
      env: {
        OUTBOX_SCHEMA: "Bad-Name",
        OUTBOX_LEASE_TTL_MS: "10000",
        OUTBOX_HEARTBEAT_MS: "6000",
        OUTBOX_HTTP_PORT: "70000",
      },
    });
    expect(next).toEqual(
      expect.arrayContaining([expect.stringMatching(/^http\.port \(OUTBOX_HTTP_PORT\): /)]),
    );
    const cross = await problems({
      env: { OUTBOX_SCHEMA: "Bad-Name", OUTBOX_LEASE_TTL_MS: "10000", OUTBOX_HEARTBEAT_MS: "6000" },
    });
    expect(cross).toEqual(
      expect.arrayContaining([
        expect.stringMatching(/^schema \(OUTBOX_SCHEMA\): .*plain identifier/),
        "worker.heartbeatMs (OUTBOX_HEARTBEAT_MS): must be at most half of leaseTtlMs (10000), got 6000",
      ]),
    );
  });

  it("names unknown keys and bad relay configs", async () => {
    const found = await problems({
      env: {
        OUTBOX_RELAYS: JSON.stringify({
          q: { type: "smtp" },
          "bad queue": { type: "http", url: "http://x" },
        }),
      },
      overrides: { "worker.concurency": 3 },
    });
    expect(found).toContain(
      "worker.concurency: unknown field (did you mean worker.concurrency, OUTBOX_CONCURRENCY?)",
    );
    expect(found.join("\n")).toMatch(/relays\.q\.type \(OUTBOX_RELAYS\)|relays\.q \(OUTBOX_RELAYS\)/);
  });

  it("reads subscriptions (file or OUTBOX_SUBSCRIPTIONS, the environment's replacing the file's) and a relay's subscribe", async () => {
    const dir = await testTempDir("outbox-config-");
    const file = path.join(dir, "c.json");
    await writeFile(
      file,
      JSON.stringify({
        subscriptions: { billing: ["order.*"], email: ["order.placed"] },
        relays: { hook: { type: "http", url: "http://127.0.0.1:9/h", subscribe: ["order.#"] } },
      }),
    );
    const fromFile = await loadServiceConfig({ file, env: {} });
    expect(fromFile.subscriptions).toEqual({ billing: ["order.*"], email: ["order.placed"] });
    expect(fromFile.relays.hook?.subscribe).toEqual(["order.#"]);
    const fromEnv = await loadServiceConfig({
      file,
      env: { OUTBOX_SUBSCRIPTIONS: JSON.stringify({ billing: ["#"] }) },
    });
    expect(fromEnv.subscriptions).toEqual({ billing: ["#"] });
    expect((await loadServiceConfig({ env: {} })).subscriptions).toEqual({});
  });

  it("names a bad subscription pattern or queue by its place, and a relay's too", async () => {
    const found = await problems({
      env: {
        OUTBOX_SUBSCRIPTIONS: JSON.stringify({ billing: ["order.*", "order.**"], "bad queue": ["x"] }),
        OUTBOX_RELAYS: JSON.stringify({
          hook: { type: "http", url: "http://127.0.0.1:9/h", subscribe: ["ok", "a..b"] },
        }),
      },
    });
    expect(found).toEqual(
      expect.arrayContaining([
        expect.stringMatching(
          /^subscriptions\.billing\[1\] \(OUTBOX_SUBSCRIPTIONS\): "order\.\*\*" is not a topic pattern/,
        ),
        expect.stringMatching(
          /^subscriptions\.bad queue \(OUTBOX_SUBSCRIPTIONS\): "bad queue" may only hold/,
        ),
        expect.stringMatching(
          /^relays\.hook\.subscribe\[1\] \(OUTBOX_RELAYS\): "a\.\.b" is not a topic pattern/,
        ),
      ]),
    );
    expect(await problems({ env: { OUTBOX_SUBSCRIPTIONS: '{"billing": "order.*"}' } })).toEqual([
      expect.stringMatching(/^subscriptions\.billing \(OUTBOX_SUBSCRIPTIONS\): .*array/),
    ]);
  });

  it("refuses an unknown OUTBOX_ variable, naming the likely one; OUTBOX_CONFIG and other variables pass", async () => {
    const found = await problems({
      env: { OUTBOX_CONCURENCY: "4", OUTBOX_NOT_A_THING_AT_ALL: "x", OUTBOX_CONCURRENCY: "3" },
    });
    expect(found).toEqual([
      "OUTBOX_CONCURENCY: unknown environment variable (did you mean OUTBOX_CONCURRENCY (worker.concurrency)?)",
      "OUTBOX_NOT_A_THING_AT_ALL: unknown environment variable",
    ]);
    const config = await loadServiceConfig({
      env: {
        OUTBOX_CONFIG: "outbox.json",
        OUTBOX_LOG_PRETTY: "true",
        OUTBOX_EMPTY: "",
        PATH: "/bin",
        outbox_x: "1",
      },
    });
    expect(config.log.pretty).toBe(true);
  });

  it("lists every wrong field at once, a bad log level among them", async () => {
    const found = await problems({
      env: {
        OUTBOX_LOG_LEVEL: "loud",
        OUTBOX_SCHEMA: "Bad-Name",
        OUTBOX_LEASE_TTL_MS: "10000",
        OUTBOX_HEARTBEAT_MS: "6000",
        OUTBOX_RELAYS: JSON.stringify({
          "bad queue": { type: "http", url: "http://x" },
          q: { type: "smtp" },
        }),
        OUTBOX_HTTP_PORT: "70000",
        DATABASE_URL: "host=db dbname=app",
        OUTBOX_CONCURENCY: "4",
      },
      overrides: { "worker.concurency": 3 },
    });
    expect(found).toEqual(
      expect.arrayContaining([
        expect.stringMatching(/^log\.level \(OUTBOX_LOG_LEVEL\): /),
        expect.stringMatching(/^schema \(OUTBOX_SCHEMA\): .*plain identifier/),
        "worker.heartbeatMs (OUTBOX_HEARTBEAT_MS): must be at most half of leaseTtlMs (10000), got 6000",
        expect.stringMatching(/^relays\.bad queue \(OUTBOX_RELAYS\): "bad queue" may only hold/),
        expect.stringMatching(/^relays\.q\.type \(OUTBOX_RELAYS\)/),
        expect.stringMatching(/^http\.port \(OUTBOX_HTTP_PORT\): /),
        expect.stringMatching(/^databaseUrl \(DATABASE_URL\): /),
        expect.stringMatching(/^OUTBOX_CONCURENCY: unknown environment variable/),
        "worker.concurency: unknown field (did you mean worker.concurrency, OUTBOX_CONCURRENCY?)",
      ]),
    );
    expect(found).toHaveLength(9);
  });

  it("refuses a DATABASE_URL that is not a postgres:// URL, naming the form and masking the password", async () => {
    const form = "postgres://<user>:<password>@<host>:5432/<database>";
    const cases: [string, RegExp][] = [
      [
        "host=db port=5432 dbname=app password=Sekret-1",
        /libpq keyword\/value string \(host, port, dbname, password\)/,
      ],
      [
        "postgres://app:Sekret-1@db:abc/app",
        /got "postgres:\/\/\*\*\*@db:abc\/app", which is not a valid URL \(the port must be a number/,
      ],
      ["postgres://app:Sek#ret-1@db/app", /got "postgres:\/\/\*\*\*@db\/app", which is not a valid URL/],
      ["http://app:Sekret-1@db/app", /got a URL of scheme http: \("http:\/\/\*\*\*@db\/app"\)/],
      ["db.internal/app", /got "db\.internal\/app"$/],
    ];
    for (const [url, reason] of cases) {
      const [problem, ...rest] = await problems({ env: { DATABASE_URL: url } });
      expect(rest).toEqual([]);
      expect(problem).toMatch(/^databaseUrl \(DATABASE_URL\): expected a URL like /);
      expect(problem).toContain(form);
      expect(problem).toMatch(reason);
      expect(problem).not.toContain("Sekret");
    }
    // OUTBOX_LISTEN_URL and --database-url are held to the same form.
    expect(await problems({ env: { OUTBOX_LISTEN_URL: "http://x/db" } })).toEqual([
      expect.stringMatching(/^listenUrl \(OUTBOX_LISTEN_URL\): expected a URL like /),
    ]);
    expect(await problems({ env: {}, overrides: { databaseUrl: "dbname=app" } })).toEqual([
      expect.stringMatching(/^databaseUrl \(DATABASE_URL\): .*libpq keyword/),
    ]);
    // Every form node-postgres connects with as meant is still taken.
    for (const url of [
      "postgres://postgres@127.0.0.1:5432/test",
      "postgresql://app:p%40ss@db.internal/app?sslmode=require",
      "postgres://app:pa ss@db/app",
      "postgres://app:secret@/app?host=/var/run/postgresql",
      "postgres:///app?host=/var/run/postgresql",
      "postgres://app@[::1]:5432/app",
      "socket:/var/run/postgresql?db=app",
      "/var/run/postgresql app",
    ]) {
      expect((await loadServiceConfig({ env: { DATABASE_URL: url } })).databaseUrl).toBe(url);
    }
  });

  it("maps every field to a distinct OUTBOX_ variable (or DATABASE_URL)", () => {
    const envs = configFields.map((f) => f.env);
    expect(new Set(envs).size).toBe(envs.length);
    for (const env of envs) expect(env).toMatch(/^(OUTBOX_[A-Z0-9_]+|DATABASE_URL)$/);
  });

  it("the docs' configuration table is the one the schema produces", () => {
    const table = readDoc("docs/reference/configuration.md")
      .split("<!-- config-table:start -->")[1]
      ?.split("<!-- config-table:end -->")[0]
      ?.trim();
    // Compared cell by cell: the formatter pads Markdown tables. Regenerate with: npm run -s docs:config
    const cells = (markdown: string | undefined) =>
      (markdown ?? "")
        .split("\n")
        .filter((line) => !/^\|\s*-/.test(line))
        .map((line) => line.split("|").map((cell) => cell.trim()));
    expect(cells(table)).toEqual(cells(renderConfigTable()));
  });
});

describe("pretty logs", () => {
  it("turns a pino JSON line into time, level, message and fields", () => {
    const line = prettyLine(
      JSON.stringify({
        level: 40,
        time: Date.UTC(2026, 0, 1, 12, 0, 0, 5),
        msg: "fetch failed",
        loop: "fetch",
        n: 2,
      }),
    );
    expect(line).toBe("12:00:00.005 WARN  fetch failed  loop=fetch n=2");
  });
});
