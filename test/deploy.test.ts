/**
 * deploy/kubernetes: every manifest validates against the Kubernetes API schemas (kubernetes-models) and the
 * KEDA CRD schemas (@kubernetes-models/keda, generated from KEDA's Go API types), and the pieces agree with
 * each other and with the worker: the grace period covers the stop timeout, the probes ask the HTTP port,
 * the secret and names line up, every OUTBOX_* variable is one the service knows, and KEDA's query counts
 * states the unprocessed view has. Pure npm, no cluster and no database: nothing here is ever skipped.
 */
import { readdirSync, readFileSync } from "node:fs";
import path from "node:path";
import { ScaledObject } from "@kubernetes-models/keda/keda.sh/v1alpha1/ScaledObject";
import { TriggerAuthentication } from "@kubernetes-models/keda/keda.sh/v1alpha1/TriggerAuthentication";
import { Deployment } from "kubernetes-models/apps/v1/Deployment";
import { Secret } from "kubernetes-models/v1/Secret";
import { Service } from "kubernetes-models/v1/Service";
import { describe, expect, it } from "vitest";
import { parseAllDocuments } from "yaml";
import { configFields } from "../src/service/config.js";
import { MESSAGE_STATES } from "../src/sql/peek.js";
import { workerTuningSchema } from "../src/worker/options.js";

const DIR = path.join(import.meta.dirname, "..", "deploy", "kubernetes");

// biome-ignore lint/suspicious/noExplicitAny: manifests are untyped YAML until validated
type Manifest = Record<string, any>;

/** apiVersion/kind → the model whose validate() checks the object against its schema. */
const MODELS: Record<string, new (data: never) => { validate(): void }> = {
  "apps/v1/Deployment": Deployment,
  "v1/Service": Service,
  "v1/Secret": Secret,
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

function load(file: string): Manifest[] {
  const docs = parseAllDocuments(readFileSync(path.join(DIR, file), "utf8"));
  return docs.map((d, i) => {
    if (d.errors.length > 0) throw new Error(`${file} document ${i + 1}: ${d.errors[0]?.message}`);
    return d.toJS() as Manifest;
  });
}

const files = readdirSync(DIR).filter((f) => f.endsWith(".yaml") && f !== "kustomization.yaml");
const all = files.flatMap((file) => load(file).map((doc, i) => ({ file, doc, where: `${file}#${i + 1}` })));
const one = (kind: string): Manifest => {
  const found = all.filter((m) => m.doc.kind === kind);
  expect(found, kind).toHaveLength(1);
  return found[0]?.doc as Manifest;
};

describe("deploy/kubernetes manifests", () => {
  it.each(all.map((m) => [m.where, m.doc] as const))("%s validates against its schema", (where, doc) => {
    validateManifest(doc, where);
  });

  it("the validator rejects a broken manifest (so a pass means something)", () => {
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
  });

  it("kustomization.yaml lists existing files, never the placeholder Secret", () => {
    const k = load("kustomization.yaml")[0] ?? {};
    expect(k.kind).toBe("Kustomization");
    for (const r of k.resources as string[]) expect(files).toContain(r);
    expect(k.resources).not.toContain("secret.yaml");
  });

  const deployment = () => one("Deployment");
  const container = () => deployment().spec.template.spec.containers[0] as Manifest;
  const env = (name: string) =>
    (container().env as Manifest[]).find((e) => e.name === name) as Manifest | undefined;

  it("the grace period outlasts the worker's stop timeout, set explicitly", () => {
    const stopMs = Number(env("OUTBOX_STOP_TIMEOUT_MS")?.value);
    expect(stopMs).toBe(workerTuningSchema.parse({}).stopTimeoutMs); // the default, written down
    const grace = deployment().spec.template.spec.terminationGracePeriodSeconds as number;
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
    const pod = deployment().spec.template.spec;
    expect(pod.securityContext).toMatchObject({ runAsNonRoot: true, runAsUser: 1000 });
    expect(container().securityContext).toMatchObject({
      readOnlyRootFilesystem: true,
      allowPrivilegeEscalation: false,
    });
    // The image's user, by name: 1000 is `node` in the node images.
    expect(readFileSync(path.join(DIR, "..", "..", "Dockerfile"), "utf8")).toMatch(/^USER node$/m);
  });

  it("names line up: secret keys, ScaledObject target, TriggerAuthentication, the view's states", () => {
    const secret = one("Secret");
    const keys = Object.keys(secret.stringData ?? secret.data ?? {});
    const ref = env("DATABASE_URL")?.valueFrom.secretKeyRef;
    expect(ref.name).toBe(secret.metadata.name);
    expect(keys).toContain(ref.key);
    for (const value of Object.values(secret.stringData as Record<string, string>)) {
      expect(value).toMatch(/CHANGE-ME.*\.invalid/); // obviously fake
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
