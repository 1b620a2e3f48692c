import { scrubSecrets } from "../util/redact.js";

/** Network errors and server states that mean the database cannot be reached or used right now. */
const UNAVAILABLE: Readonly<Record<string, string>> = {
  ECONNREFUSED: "connection refused",
  ECONNRESET: "connection reset",
  ENOTFOUND: "host not found",
  EAI_AGAIN: "host name lookup failed",
  ETIMEDOUT: "connection timed out",
  EHOSTUNREACH: "host unreachable",
  ENETUNREACH: "network unreachable",
  EPIPE: "connection lost",
  "57P01": "the server is shutting down",
  "57P02": "the server is shutting down",
  "57P03": "the server is starting up",
  "53300": "too many connections",
};

function codeOf(error: unknown): string | undefined {
  const code = (error as { code?: unknown } | null)?.code;
  return typeof code === "string" ? code : undefined;
}

/**
 * Why the database is unavailable, in a few words of our own (never the driver's text, which may quote
 * a host or a user), or undefined when the error is something else (a 500).
 */
export function unavailableReason(error: unknown): string | undefined {
  const code = codeOf(error);
  if (code !== undefined && UNAVAILABLE[code]) return UNAVAILABLE[code];
  if (code?.startsWith("08")) return "connection failure";
  const text = error instanceof Error ? error.message : "";
  // pg's own connect and query timeouts, and a connection cut mid-answer, carry no code.
  if (/timeout exceeded when trying to connect|connection timeout/i.test(text)) return "connection timed out";
  if (/query read timeout/i.test(text)) return "no answer in time";
  if (/connection terminated|connection ended|not queryable/i.test(text)) return "connection lost";
  return undefined;
}

/**
 * The database as an operator knows it, for a 503: `database "app" at db.internal:5432`. Never the user,
 * the password or any parameter of the connection string.
 */
export function describeDatabase(connectionString: string | undefined): string {
  if (!connectionString) return "the database";
  try {
    // "user@/db?host=/socket" has no host for the URL parser: it gets one, the socket path wins below.
    const url = new URL(connectionString.replace("@/", "@localhost/"));
    // A Unix socket is given as ?host=/path, the URL's host then empty.
    const host = url.searchParams.get("host") || decodeURIComponent(url.hostname) || "localhost";
    const name = decodeURIComponent(url.pathname.replace(/^\//, ""));
    const where = `${host}:${url.port || "5432"}`;
    return scrubSecrets(name ? `database ${JSON.stringify(name)} at ${where}` : `the database at ${where}`);
  } catch {
    return "the database";
  }
}
