import { configFields, serviceConfigSchema } from "./config.js";

function valueAt(object: unknown, dotted: string): unknown {
  return dotted
    .split(".")
    .reduce<unknown>((node, key) => (node as Record<string, unknown> | undefined)?.[key], object);
}

function show(value: unknown): string {
  if (value === undefined) return "–";
  if (typeof value === "object") return Object.keys(value as object).length ? JSON.stringify(value) : "–";
  return `\`${String(value)}\``;
}

/**
 * The README's configuration table, made from the schema itself: defaults come from parsing an empty
 * config, so the documentation cannot drift from the code (a test compares the two).
 */
export function renderConfigTable(): string {
  const defaults = serviceConfigSchema.parse({});
  const rows = configFields.map(
    (f) => `| \`${f.path}\` | \`${f.env}\` | ${show(valueAt(defaults, f.path))} | ${f.description} |`,
  );
  return ["| field | environment | default | meaning |", "| --- | --- | --- | --- |", ...rows].join("\n");
}
