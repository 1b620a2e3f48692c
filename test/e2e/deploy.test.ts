/**
 * deploy/kubernetes: every manifest validates against the Kubernetes API schemas (kubernetes-models) and the
 * KEDA CRD schemas (@kubernetes-models/keda, generated from KEDA's Go API types), with no field the API does
 * not have (their TypeScript interfaces, strictly), as files and as `kubectl kustomize` renders them; and
 * the pieces agree with each other and with the worker: one place sets the image, the init containers
 * migrate then grant as the owner with a Secret of their own, the grace period covers the stop timeout, the
 * probes ask the HTTP port, the PodDisruptionBudget and NetworkPolicy select the worker's pods, and KEDA's
 * query counts states the unprocessed view has. No cluster and no database (test/e2e/deploy-fresh-database.test.ts
 * runs the pod's steps on one); only the render needs kubectl, and says so when it is missing.
 */
import { spawnSync } from "node:child_process";
import { readdirSync, readFileSync } from "node:fs";
import path from "node:path";
import { ScaledObject } from "@kubernetes-models/keda/keda.sh/v1alpha1/ScaledObject";
import { TriggerAuthentication } from "@kubernetes-models/keda/keda.sh/v1alpha1/TriggerAuthentication";
import { Deployment } from "kubernetes-models/apps/v1/Deployment";
import { NetworkPolicy } from "kubernetes-models/networking.k8s.io/v1/NetworkPolicy";
import { PodDisruptionBudget } from "kubernetes-models/policy/v1/PodDisruptionBudget";
import { Secret } from "kubernetes-models/v1/Secret";
import { Service } from "kubernetes-models/v1/Service";
import { describe, expect, it } from "vitest";
import { parseAllDocuments } from "yaml";
import { configFields } from "../../src/service/config.js";
import { MESSAGE_STATES } from "../../src/sql/peek.js";
import { workerTuningSchema } from "../../src/worker/options.js";
import { manifestTypeErrors } from "../support/manifest-types.js";

const ROOT = path.resolve(".");
const DIR = path.join(ROOT, "deploy", "kubernetes");
const VERSION = JSON.parse(readFileSync(path.join(ROOT, "package.json"), "utf8")).version as string;

// biome-ignore lint/suspicious/noExplicitAny: manifests are untyped YAML until validated
type Manifest = Record<string, any>;

/** apiVersion/kind → the model whose validate() checks the object against its schema. */
const MODELS: Record<string, new (data: never) => { validate(): void }> = {
  "apps/v1/Deployment": Deployment,
  "v1/Service": Service,
  "v1/Secret": Secret,
  "policy/v1/PodDisruptionBudget": PodDisruptionBudget,
  "networking.k8s.io/v1/NetworkPolicy": NetworkPolicy,
  "keda.sh/v1alpha1/ScaledObject": ScaledObject,
  "keda.sh/v1alpha1/TriggerAuthentication": TriggerAuthentication,
};

/** Throws with the file, kind and the schema's complaint when the manifest does not validate. */
function validateManifest(doc: Manifest, where: string): void {
  const model = MODELS[`${doc.apiVersion}/${doc.kind}`];
  if (!model) throw new Error(`${where}: no schema for ${doc.apiVersion} ${doc.kind}`);
  try {
    new model(doc as never).validate();
  } catch (error) {
    throw new Error(`${where}: ${doc.kind} ${doc.metadata?.name}: ${(error as Error).message}`);
  }
}

function parseDocs(text: string, name: string): Manifest[] {
  return parseAllDocuments(text).map((d, i) => {
    if (d.errors.length > 0) throw new Error(`${name} document ${i + 1}: ${d.errors[0]?.message}`);
    return d.toJS() as Manifest;
  });
}

const load = (file: string): Manifest[] => parseDocs(readFileSync(path.join(DIR, file), "utf8"), file);

const files = readdirSync(DIR).filter((f) => f.endsWith(".yaml") && f !== "kustomization.yaml");
const all = files.flatMap((file) => load(file).map((doc, i) => ({ file, doc, where: `${file}#${i + 1}` })));
const kustomization = load("kustomization.yaml")[0] ?? {};
const one = (kind: string): Manifest => {
  const found = all.filter((m) => m.doc.kind === kind);
  expect(found, kind).toHaveLength(1);
  return found[0]?.doc as Manifest;
};
const secretNamed = (name: string): Manifest | undefined =>
  all.find((m) => m.doc.kind === "Secret" && m.doc.metadata?.name === name)?.doc;

/** Does a label selector (matchLabels only, as ours are) select these labels? */
function selects(selector: Manifest | undefined, labels: Record<string, string>): boolean {
  const match = (selector?.matchLabels ?? {}) as Record<string, string>;
  expect(selector?.matchExpressions, "selectors here use matchLabels only").toBeUndefined();
  return Object.keys(match).length > 0 && Object.entries(match).every(([k, v]) => labels[k] === v);
}

/** `kubectl kustomize deploy/kubernetes`, or why it cannot run here. */
function render(): { docs: Manifest[]; skip?: undefined } | { docs?: undefined; skip: string } {
  const result = spawnSync("kubectl", ["kustomize", DIR], { encoding: "utf8", timeout: 300_000 });
  const code = (result.error as NodeJS.ErrnoException | undefined)?.code;
  if (code === "ENOENT") return { skip: "kubectl is not installed (not on PATH)" };
  if (result.error) throw new Error(`kubectl kustomize did not run: ${result.error.message}`);
  if (result.status !== 0) throw new Error(`kubectl kustomize failed: ${result.stderr}`);
  return { docs: parseDocs(result.stdout, "kubectl kustomize") };
}
const rendered = render();
if (rendered.skip) console.warn(`deploy.test.ts: skipping the kubectl render, ${rendered.skip}`);

describe("deploy/kubernetes manifests", () => {
  it.each(all.map((m) => [m.where, m.doc] as const))("%s validates against its schema", (where, doc) => {
    validateManifest(doc, where);
  });

  it("has no field its API does not know (type-checked against the models' interfaces)", () => {
    expect(manifestTypeErrors(all)).toEqual([]);
  });

  it("the validators reject a broken manifest (so a pass means something)", () => {
    const deployment = structuredClone(one("Deployment"));
    deployment.spec.template.spec.terminationGracePeriodSeconds = "45";
    expect(() => validateManifest(deployment, "broken")).toThrow(
      /terminationGracePeriodSeconds must be integer/,
    );
    const noTemplate = structuredClone(one("Deployment"));
    delete noTemplate.spec.template;
    expect(() => validateManifest(noTemplate, "broken")).toThrow(/must have required property template/);
    const scaled = structuredClone(one("ScaledObject"));
    scaled.spec.triggers[0].metadata.targetQueryValue = 1000; // KEDA's trigger metadata are strings
    expect(() => validateManifest(scaled, "broken")).toThrow(/targetQueryValue must be string/);
    const auth = structuredClone(one("TriggerAuthentication"));
    delete auth.spec.secretTargetRef[0].key;
    expect(() => validateManifest(auth, "broken")).toThrow(/must have required property key/);
    const policy = structuredClone(one("NetworkPolicy"));
    policy.spec.policyTypes = ["Ingres"];
    expect(() => validateManifest(policy, "broken")).toThrow(/must be equal to one of the allowed values/);

    // A misspelt field passes validate() (the models allow extra properties) but not the type check.
    const typo = structuredClone(one("Deployment"));
    typo.spec.template.spec.initContainers[0].imag = typo.spec.template.spec.initContainers[0].image;
    const budget = structuredClone(one("PodDisruptionBudget"));
    budget.spec.unhealthyPodEvictonPolicy = "AlwaysAllow";
    const errors = manifestTypeErrors([
      { where: "typo", doc: typo },
      { where: "budget", doc: budget },
    ]);
    expect(errors).toEqual([
      expect.stringMatching(/^typo: .*'"imag"' does not exist in type/),
      expect.stringMatching(/^budget: .*'"unhealthyPodEvictonPolicy"' does not exist in type/),
    ]);
  });

  it("kustomization.yaml lists every manifest but the placeholder Secrets", () => {
    expect(kustomization.kind).toBe("Kustomization");
    // A file left out would never be applied; secret.yaml holds fake values and must never be.
    expect([...(kustomization.resources as string[])].sort()).toEqual(
      files.filter((f) => f !== "secret.yaml").sort(),
    );
  });

  it.skipIf(rendered.skip !== undefined)(
    "kubectl kustomize renders every listed manifest, each valid against its schema and type",
    () => {
      const docs = rendered.docs ?? [];
      const key = (d: Manifest) => `${d.kind}/${d.metadata?.name}`;
      const listed = (kustomization.resources as string[]).flatMap((f) => load(f));
      expect(docs.map(key).sort()).toEqual(listed.map(key).sort());
      docs.forEach((doc, i) => {
        validateManifest(doc, `rendered#${i + 1}`);
        expect(doc.metadata.labels?.["app.kubernetes.io/part-of"], key(doc)).toBe("pg-outbox-worker");
      });
      expect(manifestTypeErrors(docs.map((doc, i) => ({ where: `rendered#${i + 1}`, doc })))).toEqual([]);
    },
  );

  const deployment = () => one("Deployment");
  const podSpec = () => deployment().spec.template.spec as Manifest;
  const container = () => podSpec().containers[0] as Manifest;
  const initContainers = () => (podSpec().initContainers ?? []) as Manifest[];
  const envOf = (c: Manifest, name: string) =>
    ((c.env ?? []) as Manifest[]).find((e) => e.name === name) as Manifest | undefined;
  const env = (name: string) => envOf(container(), name);

  describe("the image, set in one place", () => {
    const images = () => kustomization.images as Manifest[];
    const everyContainer = () => [...initContainers(), ...(podSpec().containers as Manifest[])];

    it("every container names the one image kustomization.yaml's `images:` sets, without a tag", () => {
      expect(images()).toHaveLength(1);
      const [image] = images();
      expect(image?.newName, "the registry and name to pull").toMatch(/^[a-z0-9.-]+(:\d+)?\/[a-z0-9._/-]+$/);
      // The release the manifests were written for; bump it with package.json.
      expect(image?.newTag).toBe(VERSION);
      expect(everyContainer().length).toBeGreaterThanOrEqual(3);
      for (const c of everyContainer()) expect(c.image, c.name).toBe(image?.name);
    });

    it.skipIf(rendered.skip !== undefined)("the render pulls that image in every container", () => {
      const [image] = images();
      const pod = rendered.docs?.find((d) => d.kind === "Deployment")?.spec.template.spec as Manifest;
      const containers = [...pod.initContainers, ...pod.containers] as Manifest[];
      expect(containers.map((c) => c.image)).toEqual(
        containers.map(() => `${image?.newName}:${image?.newTag}`),
      );
    });
  });

  describe("init containers: migrate, then grant, as the owner", () => {
    it("run `migrate` then `grant` with the image's entrypoint, in that order", () => {
      expect(initContainers().map((c) => c.name)).toEqual(["migrate", "grant"]);
      const [migrate, grant] = initContainers();
      // The args are the CLI's: the image's ENTRYPOINT runs it, and none of ours replaces it.
      const dockerfile = readFileSync(path.join(ROOT, "Dockerfile"), "utf8");
      expect(dockerfile).toMatch(/^ENTRYPOINT \["node", "dist\/cli\/main\.js"\]$/m);
      for (const c of [...initContainers(), container()]) expect(c.command, c.name).toBeUndefined();
      expect(migrate?.args).toEqual(["migrate"]);
      expect(grant?.args?.[0]).toBe("grant");
      // `grant` makes no logins: --create would leave NOLOGIN roles the worker could not connect as.
      expect(grant?.args).not.toContain("--create");
      // The outbox schema of KEDA's query: no container picks another one.
      for (const c of [...initContainers(), container()]) {
        expect(envOf(c, "OUTBOX_SCHEMA"), c.name).toBeUndefined();
        expect(c.args, c.name).not.toContain("--schema");
      }
    });

    it("connect with the owner's Secret, which the worker container never references", () => {
      const owner = secretNamed("outbox-worker-owner");
      expect(owner, "secret.yaml has the owner's placeholder Secret").toBeDefined();
      for (const c of initContainers()) {
        const ref = envOf(c, "DATABASE_URL")?.valueFrom?.secretKeyRef;
        expect(ref, c.name).toEqual({ name: "outbox-worker-owner", key: "DATABASE_URL" });
        expect(c.env, `${c.name}: only DATABASE_URL`).toHaveLength(1);
      }
      expect(JSON.stringify(container())).not.toContain("outbox-worker-owner");
      expect(container().envFrom).toBeUndefined();
      const ref = env("DATABASE_URL")?.valueFrom?.secretKeyRef;
      expect(ref.name).not.toBe("outbox-worker-owner");
    });

    it("grant the roles the other Secrets connect as: the worker's, and KEDA's inspector", () => {
      const args = initContainers()[1]?.args as string[];
      const option = (name: string) => args[args.indexOf(name) + 1];
      const userOf = (secret: string, key: string) =>
        new URL(secretNamed(secret)?.stringData?.[key] as string).username;
      expect(option("--worker")).toBe(userOf("outbox-worker-db", "DATABASE_URL"));
      expect(option("--inspector")).toBe(userOf("outbox-worker-db", "KEDA_DATABASE_URL"));
      const auth = one("TriggerAuthentication").spec.secretTargetRef[0];
      expect([auth.name, auth.key]).toEqual(["outbox-worker-db", "KEDA_DATABASE_URL"]);
      // The owner is none of them.
      expect(userOf("outbox-worker-owner", "DATABASE_URL")).not.toBe(option("--worker"));
    });

    it("run as hardened as the worker", () => {
      for (const c of initContainers()) {
        expect(c.securityContext, c.name).toEqual(container().securityContext);
        expect(c.resources?.limits?.memory, c.name).toBeDefined();
      }
    });
  });

  it("the grace period outlasts the worker's stop timeout, set explicitly", () => {
    const stopMs = Number(env("OUTBOX_STOP_TIMEOUT_MS")?.value);
    expect(stopMs).toBe(workerTuningSchema.parse({}).stopTimeoutMs); // the default, written down
    const grace = podSpec().terminationGracePeriodSeconds as number;
    expect(grace * 1000 - stopMs).toBeGreaterThanOrEqual(10_000);
  });

  it("every OUTBOX_* variable is one the service knows, with a value its schema takes", () => {
    const known = new Set(configFields.map((f) => f.env));
    const names = (container().env as Manifest[]).map((e) => e.name as string);
    for (const name of names.filter((n) => n.startsWith("OUTBOX_"))) expect(known, name).toContain(name);
    expect(names).toContain("DATABASE_URL");
    expect(env("DATABASE_URL")?.valueFrom?.secretKeyRef).toBeDefined();
  });

  it("probes ask /healthz and /readyz on OUTBOX_HTTP_PORT", () => {
    const c = container();
    const port = Number(env("OUTBOX_HTTP_PORT")?.value);
    const named = (c.ports as Manifest[]).find((p) => p.name === c.readinessProbe.httpGet.port);
    expect(named?.containerPort).toBe(port);
    expect(c.livenessProbe.httpGet).toMatchObject({ path: "/healthz", port: named?.name });
    expect(c.readinessProbe.httpGet).toMatchObject({ path: "/readyz", port: named?.name });
    expect(deployment().spec.template.metadata.annotations["prometheus.io/port"]).toBe(String(port));
  });

  it("runs as non-root on a read-only root filesystem", () => {
    expect(podSpec().securityContext).toMatchObject({ runAsNonRoot: true, runAsUser: 1000 });
    expect(container().securityContext).toMatchObject({
      readOnlyRootFilesystem: true,
      allowPrivilegeEscalation: false,
    });
    // The image's user, by name: 1000 is `node` in the node images.
    expect(readFileSync(path.join(ROOT, "Dockerfile"), "utf8")).toMatch(/^USER node$/m);
  });

  it("the PodDisruptionBudget lets drains evict the worker's pods one at a time, never blocking on one replica", () => {
    const budget = one("PodDisruptionBudget").spec;
    expect(selects(budget.selector, deployment().spec.template.metadata.labels)).toBe(true);
    // minAvailable >= 1 with KEDA's single replica would make every drain wait forever.
    expect(budget.minAvailable).toBeUndefined();
    expect(budget.maxUnavailable).toBe(1);
    expect(one("ScaledObject").spec.minReplicaCount).toBe(1);
    // A database outage makes every replica NotReady: those must stay evictable.
    expect(budget.unhealthyPodEvictionPolicy).toBe("AlwaysAllow");
  });

  it("the NetworkPolicy closes the worker's pods to all but the scraper, on the HTTP port only", () => {
    const policy = one("NetworkPolicy").spec;
    expect(selects(policy.podSelector, deployment().spec.template.metadata.labels)).toBe(true);
    expect(policy.policyTypes).toContain("Ingress");
    const http = (container().ports as Manifest[]).find((p) => p.name === "http");
    expect(policy.ingress.length).toBeGreaterThan(0);
    for (const rule of policy.ingress as Manifest[]) {
      // A rule without `from` admits every source, without `ports` every port.
      expect((rule.from ?? []).length, "each rule names its sources").toBeGreaterThan(0);
      expect((rule.ports ?? []).length, "each rule names its ports").toBeGreaterThan(0);
      for (const port of rule.ports as Manifest[]) {
        expect([http?.name, http?.containerPort]).toContain(port.port);
        expect(port.protocol ?? "TCP").toBe("TCP");
      }
      for (const peer of rule.from as Manifest[]) {
        // Both in one peer: pods with these labels in these namespaces. Either alone opens far more
        // (every pod of the namespace, or pods with that label in the worker's own namespace).
        expect(peer.ipBlock, "no address ranges").toBeUndefined();
        expect(Object.keys(peer.namespaceSelector?.matchLabels ?? {}).length).toBeGreaterThan(0);
        expect(Object.keys(peer.podSelector?.matchLabels ?? {}).length).toBeGreaterThan(0);
      }
    }
    // What is scraped is that port (the pod's scrape annotations say so).
    expect(deployment().spec.template.metadata.annotations["prometheus.io/port"]).toBe(
      String(http?.containerPort),
    );
  });

  it("names line up: secret keys, ScaledObject target, TriggerAuthentication, the view's states", () => {
    const secret = secretNamed("outbox-worker-db") as Manifest;
    const keys = Object.keys(secret.stringData ?? secret.data ?? {});
    const ref = env("DATABASE_URL")?.valueFrom.secretKeyRef;
    expect(ref.name).toBe(secret.metadata.name);
    expect(keys).toContain(ref.key);
    for (const s of all.filter((m) => m.doc.kind === "Secret")) {
      for (const value of Object.values(s.doc.stringData as Record<string, string>)) {
        expect(value).toMatch(/CHANGE-ME.*\.invalid/); // obviously fake
      }
    }

    const scaled = one("ScaledObject");
    expect(scaled.spec.scaleTargetRef.name).toBe(deployment().metadata.name);
    expect(scaled.spec.minReplicaCount).toBeGreaterThanOrEqual(1);
    expect(scaled.spec.maxReplicaCount).toBeGreaterThan(scaled.spec.minReplicaCount);
    const trigger = scaled.spec.triggers[0] as Manifest;
    expect(trigger.type).toBe("postgresql");
    const auth = one("TriggerAuthentication");
    expect(trigger.authenticationRef.name).toBe(auth.metadata.name);
    const conn = (auth.spec.secretTargetRef as Manifest[]).find((r) => r.parameter === "connection");
    expect(conn?.name).toBe(secret.metadata.name);
    expect(keys).toContain(conn?.key);

    const query = trigger.metadata.query as string;
    expect(query).toMatch(/FROM outbox\.unprocessed /);
    const states = [...query.matchAll(/'([a-z_]+)'/g)].map((m) => m[1]);
    expect(states.length).toBeGreaterThan(0);
    for (const s of states) expect(MESSAGE_STATES as readonly string[]).toContain(s);
  });
});
