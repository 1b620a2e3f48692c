import { scrubSecrets } from "../util/redact.js";

/** Throw from a handler to dead-letter the message at once (reason "rejected"). */
export class PermanentError extends Error {
  override name = "PermanentError";
  // The marker, not the class, is what classifyError trusts first: a second copy of this package in
  // node_modules has its own PermanentError, which instanceof would not recognise.
  readonly permanent = true;

  constructor(message?: string, options?: { cause?: unknown }) {
    super(message, options);
  }
}

/** Throw from a handler to retry with backoff without counting the failure towards maxAttempts. */
export class TransientError extends Error {
  override name = "TransientError";
  readonly transient = true;

  constructor(message?: string, options?: { cause?: unknown }) {
    super(message, options);
  }
}

export type ErrorClass = "permanent" | "transient" | "unclassified";

const NETWORK_CODES: ReadonlySet<string> = new Set([
  "ECONNREFUSED",
  "ECONNRESET",
  "ETIMEDOUT",
  "EPIPE",
  "ENOTFOUND",
  "EAI_AGAIN",
  "EHOSTUNREACH",
  "ENETUNREACH",
  "ECONNABORTED",
  "UND_ERR_CONNECT_TIMEOUT",
  "UND_ERR_SOCKET",
  "UND_ERR_HEADERS_TIMEOUT",
  "UND_ERR_BODY_TIMEOUT",
]);

/** How many `cause` links are followed; also what stops a cyclic cause chain. */
const MAX_CAUSE_DEPTH = 5;

const DEFAULT_MAX_LENGTH = 2000;
const SCRUB_MARGIN = 16_384;

/**
 * Reads a property of an arbitrary throwable. Getters and proxies can throw, so a failed read is
 * `undefined`: classifying or describing an error must never raise a new one.
 */
function read(value: unknown, key: string): unknown {
  if (value === null || (typeof value !== "object" && typeof value !== "function")) return undefined;
  try {
    return (value as Record<string, unknown>)[key];
  } catch {
    return undefined;
  }
}

function isInstance(value: unknown, ctor: abstract new (...args: never[]) => unknown): boolean {
  try {
    return value instanceof ctor;
  } catch {
    return false;
  }
}

function isNetworkError(error: unknown): boolean {
  const code = read(error, "code");
  return (typeof code === "string" && NETWORK_CODES.has(code)) || read(error, "name") === "TimeoutError";
}

/** Permanent and transient markers on the thrown error itself win over any network heuristics. */
export function classifyError(error: unknown): ErrorClass {
  if (read(error, "permanent") === true || isInstance(error, PermanentError)) return "permanent";
  if (read(error, "transient") === true || isInstance(error, TransientError)) return "transient";
  if (isNetworkError(error)) return "transient";
  // fetch() rejects with a bare TypeError("fetch failed"); the socket error is down its cause chain.
  if (read(error, "name") === "TypeError" || isInstance(error, TypeError)) {
    let cause = read(error, "cause");
    for (let depth = 0; depth < MAX_CAUSE_DEPTH && cause !== undefined && cause !== null; depth++) {
      if (isNetworkError(cause)) return "transient";
      cause = read(cause, "cause");
    }
  }
  return "unclassified";
}

function safeString(value: unknown): string {
  try {
    return String(value);
  } catch {
    try {
      return Object.prototype.toString.call(value);
    } catch {
      return "[unprintable value]";
    }
  }
}

function describeOne(error: unknown, depth = 0): string {
  if (error === null || (typeof error !== "object" && typeof error !== "function")) return safeString(error);
  const rawName = read(error, "name");
  const name = typeof rawName === "string" && rawName !== "" ? rawName : "Error";
  const rawMessage = read(error, "message");
  let message = typeof rawMessage === "string" ? rawMessage : "";
  if (message === "") {
    // Node's dual-stack connect failure is an AggregateError with an empty message; the detail is inside.
    const inner = read(error, "errors");
    if (Array.isArray(inner) && inner.length > 0 && depth < MAX_CAUSE_DEPTH) {
      message = inner
        .slice(0, 5)
        .map((e) => describeOne(e, depth + 1))
        .join("; ");
    } else {
      const code = read(error, "code");
      if (typeof code === "string") message = code;
    }
  }
  if (message !== "") return `${name}: ${message}`;
  if (typeof rawMessage === "string" || typeof rawName === "string" || isInstance(error, Error)) return name;
  try {
    const json = JSON.stringify(error);
    if (typeof json === "string" && json !== "{}") return json;
  } catch {
    // BigInt values and cycles cannot be serialised; fall through to the tag.
  }
  return safeString(error);
}

/**
 * One readable line per error in the cause chain: "Name: message\ncaused by: Name: message", at most
 * `maxLength` characters. Never throws, whatever was thrown.
 */
export function errorMessage(error: unknown, maxLength: number = DEFAULT_MAX_LENGTH): string {
  const limit = Number.isFinite(maxLength) && maxLength >= 1 ? Math.floor(maxLength) : DEFAULT_MAX_LENGTH;
  let text: string;
  try {
    text = describeOne(error);
    const seen = new Set<unknown>([error]);
    let cause = read(error, "cause");
    for (let depth = 0; depth < MAX_CAUSE_DEPTH && cause !== undefined && !seen.has(cause); depth++) {
      if (text.length > limit) break;
      seen.add(cause);
      text += `\ncaused by: ${describeOne(cause)}`;
      cause = read(cause, "cause");
    }
  } catch {
    text = "unknown error (the thrown value could not be described)";
  }
  // Every last_error and dead-letter error is built here: no credential of a URL or a configured secret
  // may reach the table (a driver's message can quote its URL). Before the cut, so no half secret is kept;
  // past the cut plus a margin longer than any token, nothing is kept, so nothing needs scrubbing.
  text = scrubSecrets(text.length > limit + SCRUB_MARGIN ? text.slice(0, limit + SCRUB_MARGIN) : text);
  // Postgres text cannot hold NUL: one in last_error would make the whole completion batch fail.
  text = text.replaceAll("\u0000", "\\0");
  if (text.length <= limit) return text;
  let cut = text.slice(0, limit - 1);
  // Do not leave half of a surrogate pair at the cut.
  if (/[\uD800-\uDBFF]$/.test(cut)) cut = cut.slice(0, -1);
  return `${cut}…`;
}
