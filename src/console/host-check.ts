import type { IncomingMessage } from "node:http";
import { isIP } from "node:net";

/**
 * Which Host and Origin headers the console answers, against DNS rebinding: a hostile page whose name is
 * re-pointed at 127.0.0.1 reaches the console with ITS name in Host, so names are checked, and IP
 * literals are not (nobody can rebind an address: a request that names one is sent to that address).
 */
export interface HostRules {
  /** The address the HTTP server binds (http.host): allowed as a name too. */
  bindHost: string;
  /** Names the console is reached by behind a proxy or an ingress; ".example.com" also allows its subdomains. */
  allowedHosts: readonly string[];
}

/** Why a request was refused for its Host or Origin. */
export interface HostRefusal {
  status: 400 | 403;
  error: string;
}

/** An allowedHosts entry: a host name (or ".domain" for it and its subdomains), no scheme, no port. */
export const ALLOWED_HOST_PATTERN =
  /^\.?[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?)*$/i;

/** Whether a bind address only listens on this machine's loopback. */
export function isLoopbackHost(host: string): boolean {
  const h = host.toLowerCase().replace(/^\[(.*)\]$/, "$1");
  if (h === "localhost" || h.endsWith(".localhost")) return true;
  if (isIP(h) === 4) return h.startsWith("127.");
  if (isIP(h) === 6) return h === "::1" || /^(0{1,4}:){7}0{0,3}1$/.test(h) || h === "::ffff:127.0.0.1";
  return false;
}

/** The host name of a Host header or an origin's authority: lower case, no port, no trailing dot. */
export function hostName(authority: string): string | undefined {
  const text = authority.trim().toLowerCase();
  const match = /^(\[[0-9a-f:.]+\]|[^:[\]]+)(?::(\d{1,5}))?$/.exec(text);
  if (!match?.[1]) return undefined;
  return match[1].replace(/^\[(.*)\]$/, "$1").replace(/\.$/, "");
}

function nameAllowed(name: string, rules: HostRules): boolean {
  if (isIP(name) !== 0) return true;
  // Browsers resolve localhost and *.localhost themselves, to loopback: no page can take them over.
  if (name === "localhost" || name.endsWith(".localhost")) return true;
  if (name === rules.bindHost.toLowerCase()) return true;
  return listed(name, rules);
}

function listed(name: string, rules: HostRules): boolean {
  return rules.allowedHosts.some((entry) => {
    const e = entry.toLowerCase();
    return e.startsWith(".") ? name === e.slice(1) || name.endsWith(e) : name === e;
  });
}

/** Quoted back in an answer: the header is the client's own text, so it is cut short. */
const quote = (text: string) => JSON.stringify(text.length > 80 ? `${text.slice(0, 80)}…` : text);

/** Every console request: its Host must name this server (an IP, localhost, the bind host or an allowed name). */
export function checkHost(req: IncomingMessage, rules: HostRules): HostRefusal | undefined {
  const host = req.headers.host;
  if (typeof host !== "string" || host === "") {
    return { status: 400, error: "a Host header is required" };
  }
  const name = hostName(host);
  if (name === undefined) return { status: 400, error: `the Host header ${quote(host)} is not a host` };
  if (nameAllowed(name, rules)) return undefined;
  return {
    status: 403,
    error: `this console does not answer to the host ${quote(name)}: add it to console.allowedHosts (OUTBOX_CONSOLE_ALLOWED_HOSTS) if the console is reached by that name`,
  };
}

/**
 * Writes: an Origin, when the browser sends one, must be this page's own (the same host and port as
 * Host) or an allowed name, so no other site, nor another local port, can post to the console.
 */
export function checkOrigin(req: IncomingMessage, rules: HostRules): HostRefusal | undefined {
  const origin = req.headers.origin;
  if (origin === undefined) return undefined;
  let authority: string | undefined;
  try {
    const url = new URL(origin);
    if (url.protocol === "http:" || url.protocol === "https:") authority = url.host;
  } catch {
    authority = undefined;
  }
  const refused = {
    status: 403 as const,
    error: `a write from the origin ${quote(origin)} is refused: only the console's own page may write`,
  };
  if (authority === undefined) return refused;
  if (authority === (req.headers.host ?? "").toLowerCase()) return undefined;
  const name = hostName(authority);
  return name !== undefined && listed(name, rules) ? undefined : refused;
}
