/**
 * Keeping credentials out of every text the package writes: log lines, error texts (and so last_error and
 * dead letters), /readyz and CLI output. Two layers, because neither is enough alone:
 * - patterns: any URL's user info (`scheme://***@host`), sensitive query parameters, `password=…`;
 * - a process-wide registry of the secrets the process was configured with, for texts that quote a
 *   secret without its URL around it (a driver echoing a token, a header value in an error).
 */

const MASK = "***";

/** Shorter strings are not registered: replacing every "abc" in every log line would ruin the logs. */
export const MIN_SECRET_LENGTH = 4;

/** Query parameter names whose values are credentials (password, sslpassword, token, api_key, auth, sig, …). */
const SENSITIVE_PARAM = /pass|pwd|token|secret|key|auth|credential|signature|^sig$/i;

/**
 * Schemes whose URLs carry a token as a username-only user info (`nats://TOKEN@host`). Elsewhere a
 * user info without a password is a user name ("postgres"), which is not registered: masking that word
 * everywhere would hide nothing secret and garble the logs. URL renderings hide it either way.
 */
const TOKEN_USER_SCHEMES = new Set(["nats:", "tls:", "ws:", "wss:"]);

// A scheme, then the user info up to the last "@" of the authority ("/", "?", "#" or a space end it).
const URL_USER_INFO = /\b([a-z][a-z0-9+.-]*:\/\/)[^\s/?#"'<>\\`]*@/gi;
// A query parameter in a URL in free text; the name is checked against SENSITIVE_PARAM.
const QUERY_PARAM = /([?&])([^=&\s#"'<>]+)=([^&\s#"'<>]*)/g;
// libpq keyword/value strings and stray `password=…` outside a URL.
const PASSWORD_ASSIGNMENT = /\b((?:ssl)?password|pwd)(\s*=\s*)[^\s&'",;]+/gi;

const registry = new Set<string>();
/** Longest first, so a secret that contains another is replaced whole; rebuilt when the registry grows. */
let ordered: string[] = [];

function add(value: string | undefined): void {
  if (value === undefined || value.length < MIN_SECRET_LENGTH || value === MASK || registry.has(value))
    return;
  registry.add(value);
  // As it appears inside a JSON string (a log line, a JSON error body): quotes and backslashes escaped.
  const escaped = JSON.stringify(value).slice(1, -1);
  if (escaped !== value) registry.add(escaped);
  ordered = [...registry].sort((a, b) => b.length - a.length);
}

function decoded(value: string): string | undefined {
  try {
    return decodeURIComponent(value);
  } catch {
    return undefined;
  }
}

/** Register secrets to be masked in every text scrubSecrets sees from now on (too short ones are ignored). */
export function registerSecrets(...values: (string | null | undefined)[]): void {
  for (const value of values) {
    if (typeof value !== "string") continue;
    add(value);
    add(value.trim());
    // "Bearer abc…": the credential may also be quoted without its scheme word.
    const parts = value.trim().split(/\s+/);
    if (parts.length > 1) add(parts.slice(1).join(" "));
  }
}

/**
 * Register every credential of a URL: its password, a username-only token (NATS), and the values of
 * sensitive query parameters, both as written and percent-decoded. Not a URL: nothing is registered
 * (the patterns of scrubSecrets still apply).
 */
export function registerUrlSecrets(url: string | null | undefined): void {
  if (!url) return;
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    return;
  }
  const credentials: string[] = [];
  if (parsed.password) credentials.push(parsed.password);
  else if (parsed.username && TOKEN_USER_SCHEMES.has(parsed.protocol.toLowerCase())) {
    credentials.push(parsed.username);
  }
  for (const pair of parsed.search.slice(1).split("&")) {
    const at = pair.indexOf("=");
    if (at <= 0) continue;
    const name = decoded(pair.slice(0, at)) ?? pair.slice(0, at);
    if (SENSITIVE_PARAM.test(name)) credentials.push(pair.slice(at + 1).replaceAll("+", " "));
  }
  for (const raw of credentials) registerSecrets(raw, decoded(raw));
}

/**
 * Mask every registered secret, every URL's user info, sensitive query parameter values and
 * `password=…` in a text. Idempotent; a text with nothing to hide comes back unchanged (same string).
 */
export function scrubSecrets(text: string): string {
  let out = text;
  for (const secret of ordered) if (out.includes(secret)) out = out.replaceAll(secret, MASK);
  if (out.includes("://")) out = out.replace(URL_USER_INFO, `$1${MASK}@`);
  if (out.includes("=")) {
    out = out
      .replace(QUERY_PARAM, (whole, sep: string, name: string, value: string) =>
        value !== "" && value !== MASK && SENSITIVE_PARAM.test(name) ? `${sep}${name}=${MASK}` : whole,
      )
      .replace(PASSWORD_ASSIGNMENT, `$1$2${MASK}`);
  }
  return out;
}

/** scrubSecrets on every string (and key) of a JSON-like value; numbers and the shape stay as they are. */
export function scrubDeep(value: unknown): unknown {
  if (typeof value === "string") return scrubSecrets(value);
  if (Array.isArray(value)) return value.map(scrubDeep);
  if (value !== null && typeof value === "object") {
    // Dates, Buffers and other classes: as JSON.stringify would write them.
    const plain = "toJSON" in value && typeof value.toJSON === "function" ? value.toJSON() : value;
    if (plain !== value) return scrubDeep(plain);
    const out: Record<string, unknown> = {};
    for (const [key, inner] of Object.entries(value)) out[scrubSecrets(key)] = scrubDeep(inner);
    return out;
  }
  return value;
}

/**
 * scrubSecrets for JSON lines (pino output): the strings inside are scrubbed after parsing, so an
 * escaped secret is found and the line stays valid JSON. Lines with nothing to hide are not re-encoded.
 */
export function scrubJsonLines(chunk: string): string {
  if (scrubSecrets(chunk) === chunk) return chunk;
  return chunk
    .split("\n")
    .map((line) => {
      if (line === "" || scrubSecrets(line) === line) return line;
      try {
        return JSON.stringify(scrubDeep(JSON.parse(line)));
      } catch {
        return scrubSecrets(line);
      }
    })
    .join("\n");
}

/**
 * A connection string fit for a log line or an error: the whole user info (user, password or token)
 * becomes `***`, and sensitive query parameters too: `postgres://***@host/db?sslmode=require&password=***`.
 * Strings that do not parse as URLs are redacted by pattern.
 */
export function redactConnectionString(url: string): string {
  try {
    const parsed = new URL(url);
    if (parsed.username || parsed.password) {
      parsed.username = MASK;
      parsed.password = "";
    }
    for (const key of [...parsed.searchParams.keys()]) {
      if (SENSITIVE_PARAM.test(key)) parsed.searchParams.set(key, MASK);
    }
    return parsed.toString().replaceAll("%2A%2A%2A", MASK);
  } catch {
    // One connection string, not free text: a malformed password may hold spaces, so only "/?#" end it.
    return scrubSecrets(url.replace(/^([a-z][a-z0-9+.-]*:\/\/)[^/?#]*@/i, `$1${MASK}@`));
  }
}
