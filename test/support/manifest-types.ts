import path from "node:path";
import ts from "typescript";

/**
 * Kubernetes manifests type-checked against the kubernetes-models interfaces, the way a strict schema
 * validation (additionalProperties: false) would: each manifest becomes a typed object literal, so
 * TypeScript's excess-property check names any field the API does not have (a typo such as `imag:` or
 * `unhealthyPodEvictonPolicy:`, which the models' own validate() lets through and an API server drops or
 * refuses). Offline: the interfaces ship in the devDependencies.
 */

/** Where each kind's interface lives: `apiVersion/kind` → [module, interface]. */
export const MANIFEST_TYPES: Record<string, readonly [string, string]> = {
  "apps/v1/Deployment": ["kubernetes-models/apps/v1/Deployment", "IDeployment"],
  "v1/Service": ["kubernetes-models/v1/Service", "IService"],
  "v1/Secret": ["kubernetes-models/v1/Secret", "ISecret"],
  "policy/v1/PodDisruptionBudget": [
    "kubernetes-models/policy/v1/PodDisruptionBudget",
    "IPodDisruptionBudget",
  ],
  "networking.k8s.io/v1/NetworkPolicy": [
    "kubernetes-models/networking.k8s.io/v1/NetworkPolicy",
    "INetworkPolicy",
  ],
  "keda.sh/v1alpha1/ScaledObject": ["@kubernetes-models/keda/keda.sh/v1alpha1/ScaledObject", "IScaledObject"],
  "keda.sh/v1alpha1/TriggerAuthentication": [
    "@kubernetes-models/keda/keda.sh/v1alpha1/TriggerAuthentication",
    "ITriggerAuthentication",
  ],
};

export interface TypedManifest {
  where: string;
  doc: { apiVersion?: unknown; kind?: unknown };
}

/** One line per problem, `where: TypeScript's message`; empty when every manifest fits its type. */
export function manifestTypeErrors(manifests: readonly TypedManifest[]): string[] {
  // A file that does not exist, in the project so that the packages resolve as the tests' own imports do.
  const file = path.resolve("test", "__manifests_typecheck__.ts");
  const errors: string[] = [];
  const typed: { where: string; doc: unknown; module: string; type: string }[] = [];
  for (const { where, doc } of manifests) {
    const entry = MANIFEST_TYPES[`${String(doc.apiVersion)}/${String(doc.kind)}`];
    if (entry) typed.push({ where, doc, module: entry[0], type: entry[1] });
    else errors.push(`${where}: no type for ${String(doc.apiVersion)} ${String(doc.kind)}`);
  }
  const lines = typed.map((m, i) => `import type { ${m.type} as T${i} } from "${m.module}";`);
  // The first line of each manifest's literal, to name the manifest a message is about.
  const starts = typed.map((m, i) => {
    const at = lines.length;
    lines.push(...`export const m${i}: T${i} = ${JSON.stringify(m.doc, null, 1)};`.split("\n"));
    return at;
  });
  const source = lines.join("\n");

  const options: ts.CompilerOptions = {
    target: ts.ScriptTarget.ES2022,
    module: ts.ModuleKind.NodeNext,
    moduleResolution: ts.ModuleResolutionKind.NodeNext,
    strict: true,
    noEmit: true,
    skipLibCheck: true,
    types: [],
  };
  const host = ts.createCompilerHost(options);
  const { getSourceFile, fileExists, readFile } = host;
  host.getSourceFile = (name, language, ...rest) =>
    name === file
      ? ts.createSourceFile(name, source, language)
      : getSourceFile.call(host, name, language, ...rest);
  host.fileExists = (name) => name === file || fileExists.call(host, name);
  host.readFile = (name) => (name === file ? source : readFile.call(host, name));
  const program = ts.createProgram([file], options, host);
  for (const d of ts.getPreEmitDiagnostics(program)) {
    const message = ts.flattenDiagnosticMessageText(d.messageText, " ");
    if (d.file?.fileName !== file || d.start === undefined) {
      errors.push(`(type check) ${message}`);
      continue;
    }
    const line = d.file.getLineAndCharacterOfPosition(d.start).line;
    const index = starts.findLastIndex((at) => at <= line);
    errors.push(`${typed[index]?.where ?? "(imports)"}: ${message}`);
  }
  return errors;
}
