/**
 * `kubectl apply -k deploy/kubernetes` against an empty database, without a cluster: the worker pod's steps
 * as the kubelet runs them, read from deploy/kubernetes/deployment.yaml and secret.yaml. Each init
 * container's args run to their end in order, with the env the manifest gives it; then the worker
 * container runs until /readyz says 200, and it delivers a message; KEDA's query runs as the role its
 * Secret names. The roles are real, as a DBA would make them: an owner with CREATE on the database only,
 * and LOGIN roles for the worker and KEDA with no rights at all until `grant` gives them theirs.
 */
import { randomBytes } from "node:crypto";
import { readFileSync } from "node:fs";
import path from "node:path";
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { parseAllDocuments } from "yaml";
import { migrationStatements } from "../../src/sql/migrations.js";
import { type CliProcess, execCli, startCli } from "../support/cli-process.js";
import { testDatabase } from "../support/database.js";

const ROOT = path.resolve(".");
const DIR = path.join(ROOT, "deploy", "kubernetes");

// biome-ignore lint/suspicious/noExplicitAny: manifests are untyped YAML (test/e2e/deploy.test.ts validates them)
type Manifest = Record<string, any>;

const load = (file: string): Manifest[] =>
  parseAllDocuments(readFileSync(path.join(DIR, file), "utf8")).map((d) => d.toJS() as Manifest);
const deployment = load("deployment.yaml").find((d) => d.kind === "Deployment") as Manifest;
const pod = deployment.spec.template.spec as Manifest;
const secrets = load("secret.yaml");
const scaled = load("scaledobject.yaml").find((d) => d.kind === "ScaledObject") as Manifest;

const db = testDatabase("dpl");
const tag = randomBytes(4).toString("hex");
// The embedded test server asks every login for a password (scram); a trust-auth server ignores it.
const PASSWORD = randomBytes(12).toString("hex");

/** The roles the placeholder Secrets connect as (outbox_owner, outbox_worker, …), each made per run. */
const roleFor = new Map<string, string>();
for (const secret of secrets) {
  for (const url of Object.values(secret.stringData as Record<string, string>)) {
    const user = new URL(url).username;
    roleFor.set(user, `dpl_${user}_${tag}`);
  }
}
const role = (user: string): string => {
  const name = roleFor.get(user);
  if (!name) throw new Error(`no Secret connects as ${user}`);
  return name;
};

/** The test server's URL, as one of the manifests' users. */
function urlAs(user: string): string {
  const url = new URL(db.url);
  url.username = role(user);
  url.password = PASSWORD;
  return url.toString();
}

/** What a Secret key holds here: its placeholder's user, on the test server. */
function secretValue(name: string, key: string): string {
  const secret = secrets.find((s) => s.metadata.name === name);
  const value = secret?.stringData?.[key] as string | undefined;
  if (value === undefined) throw new Error(`secret.yaml has no ${name}/${key}`);
  return urlAs(new URL(value).username);
}

/** A container's environment as the kubelet gives it, in this test's schema. */
function envOf(container: Manifest, more: Record<string, string> = {}): Record<string, string> {
  const env: Record<string, string> = {};
  for (const e of (container.env ?? []) as Manifest[]) {
    const ref = e.valueFrom?.secretKeyRef;
    env[e.name] = ref ? secretValue(ref.name, ref.key) : String(e.value);
  }
  return { ...env, OUTBOX_SCHEMA: db.schema, ...more };
}

/** The role names in the grant container's args, as made for this run. */
const withTestRoles = (args: string[]): string[] =>
  args.map((a) => a.replace(/^[a-z_][a-z0-9_]*$/, (name) => roleFor.get(name) ?? name));

const pools: pg.Pool[] = [];
const children: CliProcess[] = [];

beforeAll(async () => {
  const database = (await db.pool.query<{ d: string }>("SELECT current_database() AS d")).rows[0]?.d;
  for (const [user, name] of roleFor) {
    await db.pool.query(`CREATE ROLE "${name}" LOGIN PASSWORD '${PASSWORD}'`);
    // The owner creates the schema on the first migrate; nothing else is given to anyone.
    if (user === "outbox_owner") await db.pool.query(`GRANT CREATE ON DATABASE "${database}" TO "${name}"`);
  }
  expect([...roleFor.keys()].sort()).toEqual(["outbox_owner", "outbox_reader", "outbox_worker"]);
});

afterAll(async () => {
  for (const child of children) if (child.child.exitCode === null) child.child.kill("SIGKILL");
  await Promise.all(pools.map((p) => p.end()));
  // Roles are cluster-wide: leave none behind (DROP OWNED takes the owner's schema and every grant too).
  for (const name of roleFor.values()) {
    await db.pool.query(`DROP OWNED BY "${name}" CASCADE`).catch(() => {});
    await db.pool.query(`DROP ROLE IF EXISTS "${name}"`);
  }
});

/** Runs one init container to its end, as the kubelet does, failing with its output if it fails. */
async function runInit(container: Manifest): Promise<string> {
  const result = await execCli(withTestRoles(container.args), envOf(container), { cwd: ROOT });
  if (result.code !== 0) {
    throw new Error(
      `init container ${container.name} exited ${result.code}:\n${result.stdout}${result.stderr}`,
    );
  }
  return result.stdout;
}

describe("deploy/kubernetes on an empty database", () => {
  it("the init containers migrate and grant, then the worker starts, becomes ready and delivers", async () => {
    const exists = await db.pool.query("SELECT FROM pg_namespace WHERE nspname = $1", [db.schema]);
    expect(exists.rowCount, "the schema starts absent").toBe(0);

    const inits = (pod.initContainers ?? []) as Manifest[];
    for (const c of inits) await runInit(c);

    const worker = pod.containers[0] as Manifest;
    // Port 0: the manifest's 9464 could be taken on this machine; the log line says which one it got.
    const run = startCli(
      worker.args,
      envOf(worker, { OUTBOX_HTTP_PORT: "0", OUTBOX_LOG_PRETTY: "false" }),
      ROOT,
    );
    children.push(run);
    const listening = JSON.parse(await run.waitFor("http server listening")) as { port: number };
    await expect
      .poll(
        async () => {
          if (run.child.exitCode !== null) throw new Error(`the worker exited:\n${run.output()}`);
          return fetch(`http://127.0.0.1:${listening.port}/readyz`).then(
            (r) => r.status,
            () => 0,
          );
        },
        { timeout: 60_000, interval: 100 },
      )
      .toBe(200);

    // A message the example handlers serve, written as the schema's owner (what a producer's INSERT does).
    const owner = new pg.Pool({ connectionString: urlAs("outbox_owner"), max: 1 });
    pools.push(owner);
    const { rows } = await owner.query<{ id: string }>(
      `INSERT INTO "${db.schema}".messages (queue, payload) VALUES ('order.placed', '{"orderId": 7}') RETURNING id`,
    );
    // bigint ids reach handlers as strings.
    await run.waitFor(`"delivered":"${rows[0]?.id}"`);

    // KEDA counts the backlog as the role of its Secret, with the ScaledObject's query.
    const auth = load("scaledobject.yaml").find((d) => d.kind === "TriggerAuthentication") as Manifest;
    const ref = auth.spec.secretTargetRef[0];
    const keda = new pg.Pool({ connectionString: secretValue(ref.name, ref.key), max: 1 });
    pools.push(keda);
    const query = (scaled.spec.triggers[0].metadata.query as string).replace(
      "FROM outbox.",
      `FROM "${db.schema}".`,
    );
    const counted = await keda.query<{ count: string }>(query);
    expect(Number(counted.rows[0]?.count)).toBe(0);

    // The next pod (a restart, a scale-up, a rollout) runs them again: no-ops that succeed.
    for (const c of inits) await runInit(c);
    expect(await runInit(inits[0] as Manifest)).toMatch(/is up to date/);

    run.child.kill("SIGTERM");
    expect((await run.exited).code).toBe(0);
  });

  it("grant waits for a migration of the schema in progress, so pods starting at once take turns", async () => {
    // Two pods' grant steps while a third pod holds the schema's migration lock: both wait on it (two
    // GRANTs on one table at once fail with "tuple concurrently updated"), then both succeed.
    const [migrate, grant] = pod.initContainers as Manifest[];
    await runInit(migrate as Manifest); // a no-op after the test above; this one needs no other
    const holder = new pg.Client({ connectionString: db.url });
    await holder.connect();
    const lock = migrationStatements(db.names);
    await holder.query(lock.lock);
    let released = false;
    try {
      const grants = [1, 2].map(() =>
        execCli(withTestRoles(grant?.args), envOf(grant as Manifest), { cwd: ROOT }).then((r) => ({
          ...r,
          released,
        })),
      );
      await expect
        .poll(async () => {
          const { rows } = await db.pool.query<{ n: number }>(
            "SELECT count(*)::int AS n FROM pg_stat_activity WHERE application_name = 'outbox-grant' AND wait_event = 'advisory' AND usename = $1",
            [role("outbox_owner")],
          );
          return rows[0]?.n;
        })
        .toBe(2);
      released = true;
      await holder.query(lock.unlock);
      for (const result of await Promise.all(grants)) {
        expect(result.stderr).toBe("");
        expect(result.code).toBe(0);
        expect(result.released, "finished only once the lock was released").toBe(true);
      }
    } finally {
      await holder.end();
    }
  });
});
