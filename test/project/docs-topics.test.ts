import { execFile } from "node:child_process";
import { mkdir, symlink, writeFile } from "node:fs/promises";
import http from "node:http";
import type { AddressInfo } from "node:net";
import path from "node:path";
import { promisify } from "node:util";
import { HTTP } from "cloudevents";
import { afterEach, beforeAll, describe, expect, it } from "vitest";
import { listSubscriptions } from "../../src/index.js";
import { HOST } from "../support/brokers.js";
import { type CliProcess, serviceEnv, startCli } from "../support/cli-process.js";
import { testDatabase } from "../support/database.js";
import { docSection } from "../support/docs.js";
import { testTempDir } from "../support/temp-dir.js";
import { until } from "../support/worker.js";

// The "Topics and subscriptions" example of docs/guide/topics.md, as it is: its handlers module, relay config and producer
// written to a folder whose node_modules links this package (built to dist/ by the global setup) and pg, the
// service run by the built CLI there, the producer run by node. One publish reaches both subscribers: the
// billing handler in code, and the webhook receiver through the HTTP relay that subscribes to order.*. Then
// the section's plain-SQL INSERT fans out the same way and stores no row of its own.

const ROOT = path.resolve(".");
const db = testDatabase("readme_topics");
const exec = promisify(execFile);

beforeAll(() => db.migrate());
const running: CliProcess[] = [];
const cleanups: (() => Promise<unknown>)[] = [];
afterEach(async () => {
  for (const p of running.splice(0)) if (p.child.exitCode === null) p.child.kill("SIGKILL");
  for (const c of cleanups.splice(0).reverse()) await c().catch(() => {});
});

/** The section's code blocks of one language, in order. */
async function readmeBlocks(lang: string): Promise<string[]> {
  const section = docSection("docs/guide/topics.md", "# Topics and subscriptions");
  return [...section.matchAll(new RegExp(`\`\`\`${lang}\\n([\\s\\S]*?)\`\`\``, "g"))].map((m) => m[1] ?? "");
}

/** `text` with `from` replaced once; fails when `from` is not there (the page changed under the test). */
function replaced(text: string, from: string, to: string): string {
  if (!text.includes(from)) throw new Error(`the docs example no longer contains ${JSON.stringify(from)}`);
  return text.replace(from, to);
}

describe("the docs topics example", () => {
  it("runs as written: one publish, the billing handler and the webhook relay each get it once", async () => {
    const [handlersJs, producerJs] = await readmeBlocks("js");
    const [configJson] = await readmeBlocks("json");
    const [insertSql] = await readmeBlocks("sql");
    if (!handlersJs?.startsWith("// handlers.js") || !producerJs || !configJson || !insertSql)
      throw new Error(
        "the docs topics section lost one of its blocks: handlers.js, the producer, the config, the SQL",
      );
    const config = JSON.parse(configJson) as { relays: Record<string, { url: string; subscribe: string[] }> };
    const [relayQueue, relay] = Object.entries(config.relays)[0] ?? [];
    if (relayQueue === undefined || relay === undefined) throw new Error("the docs config has no relay");
    expect(relay.subscribe).toEqual(["order.*"]);

    // The webhook receiver the example points at; elsewhere if that port is taken on this machine.
    const webhook = new URL(relay.url);
    const received: { body: string; headers: http.IncomingHttpHeaders }[] = [];
    const receiver = http.createServer((req, res) => {
      let body = "";
      req.on("data", (chunk) => {
        body += chunk;
      });
      req.on("end", () => {
        received.push({ body, headers: req.headers });
        res.writeHead(204).end();
      });
    });
    let configText = configJson;
    await new Promise<void>((resolve) => {
      receiver.once("error", () => {
        console.warn(`docs-topics.test: port ${webhook.port} is taken; the receiver listens elsewhere`);
        receiver.listen(0, HOST, () => {
          const moved = `http://${HOST}:${(receiver.address() as AddressInfo).port}${webhook.pathname}`;
          configText = replaced(configJson, webhook.toString(), moved);
          resolve();
        });
      });
      receiver.listen(Number(webhook.port), webhook.hostname, resolve);
    });
    cleanups.push(() => new Promise((resolve) => receiver.close(resolve)));

    // The reader's project: an ES module package with this package and pg installed.
    const dir = await testTempDir("outbox-docs-topics-");
    await writeFile(path.join(dir, "package.json"), JSON.stringify({ type: "module", private: true }));
    await mkdir(path.join(dir, "node_modules"));
    await symlink(ROOT, path.join(dir, "node_modules", "pg-outbox-worker"), "dir");
    await symlink(path.join(ROOT, "node_modules", "pg"), path.join(dir, "node_modules", "pg"), "dir");
    await writeFile(path.join(dir, "handlers.js"), handlersJs);
    await writeFile(path.join(dir, "topics.json"), configText);
    // The example uses the default schema; this file's schema is its own.
    await writeFile(
      path.join(dir, "publish.js"),
      replaced(producerJs, "createPublisher({ ", `createPublisher({ schema: ${JSON.stringify(db.schema)}, `),
    );

    const service = startCli(
      ["run", "--handlers", "./handlers.js", "--config", "topics.json", "--http-port", "0"],
      serviceEnv(db),
      dir,
    );
    running.push(service);
    await service.waitFor("outbox-worker running", 120_000);
    // Both queues subscribed at start, as the config and the handlers module say.
    const subscriptions = await listSubscriptions(db.pool, { schema: db.schema });
    expect(subscriptions.map((s) => `${s.topic} → ${s.queue}`).sort()).toEqual([
      `order.* → ${relayQueue}`,
      "order.placed → billing",
    ]);

    const { stdout } = await exec(process.execPath, ["publish.js"], {
      cwd: dir,
      env: { ...process.env, DATABASE_URL: db.url },
    });
    // What the example's comment says it prints: one copy per subscriber, in queue-name order.
    const ids = [...stdout.matchAll(/queue: '([^']+)', id: '(\d+)'/g)].map((m) => [m[1], m[2]]);
    expect(ids.map(([queue]) => queue)).toEqual(["billing", relayQueue]);
    const billingId = ids[0]?.[1];
    const relayId = ids[1]?.[1];

    await service.waitFor(`billing: order 42 (order.placed, message ${billingId})`);
    await until(() => received.length > 0, "the webhook receives the event");
    await until(async () => {
      const { rows } = await db.pool.query(`SELECT count(*)::int AS n FROM ${db.names.messages}`);
      return rows[0].n === 0;
    }, "both copies delivered");
    expect(received).toHaveLength(1);
    const hook = received[0] as { body: string; headers: http.IncomingHttpHeaders };
    expect(HTTP.toEvent({ headers: hook.headers, body: hook.body })).toMatchObject({
      id: relayId,
      // The default type names the topic, not the relaying queue.
      type: "order.placed",
      subject: "customer-7",
      data: { orderId: 42, totalCents: 4200 },
    });
    expect(hook.headers["outbox-topic"]).toBe("order.placed");
    expect(service.output().match(/billing: order 42 /g)).toHaveLength(1);

    // The plain-SQL form: INSERT 0 0, and one copy per subscriber, delivered by each.
    const insert = await db.pool.query(replaced(insertSql, "outbox.messages", db.names.messages));
    expect(insert.rowCount).toBe(0);
    await service.waitFor("billing: order 43 (order.placed, message ");
    await until(() => received.length === 2, "the webhook receives the plain-SQL event");
    expect(JSON.parse(received[1]?.body ?? "")).toEqual({ orderId: 43, totalCents: 990 });
    const { rows: dead } = await db.pool.query(`SELECT queue, reason FROM ${db.names.deadLetters}`);
    expect(dead).toEqual([]);
  }, 300_000);
});
