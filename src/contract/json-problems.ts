import { fieldPath } from "./field-path.js";
import { textProblem } from "./storable-text.js";

/** A value in a payload that jsonb would refuse or JSON would silently change, and where it is. */
export interface JsonProblem {
  field: string;
  problem: string;
}

/**
 * An escaped NUL, or an escaped surrogate (JSON.stringify escapes only lone ones), after an even number
 * of backslashes: what jsonb refuses in JSON text.
 */
const UNSTORABLE_ESCAPE = /(?:^|[^\\])(?:\\\\)*\\u(?:0000|[dD][89a-fA-F][0-9a-fA-F]{2})/;

/**
 * The first problem of `value`, whose JSON.stringify output is `text`: a string or property name holding
 * a NUL or a lone surrogate, or a NaN or ±Infinity (which JSON writes as null). Publish is hot, so the text
 * is searched first and the value walked only when a problem may be in it.
 */
export function jsonProblem(value: unknown, text: string, root: string): JsonProblem | undefined {
  const unstorable = text.includes("\\u") && UNSTORABLE_ESCAPE.test(text);
  // A non-finite number is written as null: text without "null" holds none.
  const nonFinite = text.includes("null");
  if (!unstorable && !nonFinite) return undefined;
  const found = new Walk(root, unstorable, nonFinite).visit(jsonValue(value, ""));
  if (found || !unstorable) return found;
  // Only a toJSON that answers differently the second time gets here.
  return { field: root, problem: "holds a NUL character or a lone surrogate, which Postgres cannot store" };
}

/** What JSON.stringify serialises for a property: toJSON's result, boxed primitives unboxed. */
function jsonValue(value: unknown, key: string): unknown {
  let v = value;
  if ((typeof v === "object" && v !== null) || typeof v === "bigint") {
    const toJSON = (v as { toJSON?: unknown }).toJSON;
    if (typeof toJSON === "function") v = toJSON.call(v, key);
  }
  if (v instanceof Number) return Number(v);
  if (v instanceof String) return String(v);
  return v;
}

/** Properties JSON.stringify leaves out of an object. */
function omitted(v: unknown): boolean {
  return v === undefined || typeof v === "function" || typeof v === "symbol";
}

/** Depth first, in JSON.stringify's order, looking only for what the text search said may be there. */
class Walk {
  /** The path to the value being visited: one stack for the whole walk. */
  readonly #path: PropertyKey[] = [];

  constructor(
    readonly root: string,
    readonly text: boolean,
    readonly numbers: boolean,
  ) {}

  visit(v: unknown): JsonProblem | undefined {
    if (typeof v === "string") return this.text ? this.#problem(textProblem(v)) : undefined;
    if (typeof v === "number")
      return this.numbers && !Number.isFinite(v)
        ? this.#problem(`is ${v}, which JSON would store as null`)
        : undefined;
    if (typeof v !== "object" || v === null) return undefined;
    const path = this.#path;
    if (Array.isArray(v)) {
      for (let i = 0; i < v.length; i++) {
        path.push(i);
        const found = this.visit(jsonValue(v[i], String(i)));
        path.pop();
        if (found) return found;
      }
      return undefined;
    }
    for (const key of Object.keys(v)) {
      const child = jsonValue((v as Record<string, unknown>)[key], key);
      if (omitted(child)) continue;
      path.push(key);
      const keyProblem = this.text ? textProblem(key) : undefined;
      const found = keyProblem ? this.#problem(`the property name ${keyProblem}`) : this.visit(child);
      path.pop();
      if (found) return found;
    }
    return undefined;
  }

  #problem(problem: string | undefined): JsonProblem | undefined {
    return problem === undefined ? undefined : { field: fieldPath(this.root, this.#path), problem };
  }
}
