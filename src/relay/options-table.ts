import { z } from "zod";
import {
  httpRelayConfigSchema,
  natsRelayConfigSchema,
  rabbitmqRelayConfigSchema,
  redisRelayConfigSchema,
} from "./config.js";

interface JsonSchema {
  type?: string;
  const?: unknown;
  enum?: unknown[];
  anyOf?: JsonSchema[];
  items?: JsonSchema;
  additionalProperties?: JsonSchema | boolean;
  default?: unknown;
  description?: string;
  properties?: Record<string, JsonSchema>;
  required?: string[];
}

const schemas = {
  http: httpRelayConfigSchema,
  redis: redisRelayConfigSchema,
  nats: natsRelayConfigSchema,
  rabbitmq: rabbitmqRelayConfigSchema,
};

function typeOf(schema: JsonSchema): string {
  if (schema.enum !== undefined) return schema.enum.map((v) => JSON.stringify(v)).join(" or ");
  if (schema.anyOf !== undefined) return schema.anyOf.map(typeOf).join(" or ");
  if (schema.type === "object" && schema.properties !== undefined) {
    return `{ ${Object.keys(schema.properties).join(", ")} }`;
  }
  if (schema.type === "array") return `${typeOf(schema.items ?? {})}[]`;
  if (schema.type === "object" && typeof schema.additionalProperties === "object") {
    return `{ name: ${typeOf(schema.additionalProperties)} }`;
  }
  return schema.type ?? "any";
}

/**
 * The README's relay options table, made from the relay schemas themselves (types, defaults, whether
 * required, and each field's description), so the documentation cannot drift from the code: a test
 * compares the two. Regenerate with `npm run -s docs:relays`.
 */
export function renderRelayOptionsTable(): string {
  const rows: string[] = [];
  for (const [type, schema] of Object.entries(schemas)) {
    const json = z.toJSONSchema(schema, { io: "input" }) as JsonSchema;
    const required = new Set(json.required ?? []);
    for (const [name, field] of Object.entries(json.properties ?? {})) {
      if (name === "type") continue;
      const fallback =
        field.default !== undefined
          ? `\`${JSON.stringify(field.default)}\``
          : required.has(name)
            ? "required"
            : "–";
      rows.push(`| ${type} | \`${name}\` | ${typeOf(field)} | ${fallback} | ${field.description ?? ""} |`);
    }
  }
  return ["| relay | option | type | default | meaning |", "| --- | --- | --- | --- | --- |", ...rows].join(
    "\n",
  );
}
