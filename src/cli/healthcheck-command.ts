import { parseCommandArgs, UsageError } from "./args.js";
import { type CliIo, print, printError } from "./io.js";

export const healthcheckUsage = `Usage: outbox-worker healthcheck [--port N] [--liveness] [--timeout-ms MS] [--host ADDRESS]

Ask a running \`outbox-worker run\` whether it is ready: GET /readyz (or /healthz with --liveness) on its
HTTP server. Exit 0 on 200, 1 otherwise (not ready, no answer, nothing listening), 2 for a wrong command
line or no port. One line is printed; when not ready, the failing checks of /readyz. For a container's
HEALTHCHECK or a liveness/readiness probe: it needs no curl, only the node that runs the worker.

Options:
  --port N             the service's HTTP port (default: OUTBOX_HTTP_PORT)
  --liveness           GET /healthz (the process answers) instead of /readyz (its database answers)
  --timeout-ms MS      give up after MS milliseconds (default 3000)
  --host ADDRESS       where to ask (default: OUTBOX_HTTP_HOST when it names one address, else 127.0.0.1)
  -h, --help           show this help`;

const DEFAULT_TIMEOUT_MS = 3000;
/** Bind-all addresses: the server listens on them, but a client asks the loopback. */
const WILDCARDS = new Set(["", "0.0.0.0", "::", "[::]"]);

export async function healthcheckCommand(argv: string[], io: CliIo): Promise<number> {
  const { values } = parseCommandArgs(argv, {
    port: { type: "string" },
    liveness: { type: "boolean" },
    "timeout-ms": { type: "string" },
    host: { type: "string" },
  });
  if (values.help) {
    print(io, healthcheckUsage);
    return 0;
  }
  const rawPort = (values.port as string | undefined) ?? io.env.OUTBOX_HTTP_PORT;
  if (rawPort === undefined || rawPort === "") {
    printError(
      io,
      "outbox-worker healthcheck: no port: pass --port N or set OUTBOX_HTTP_PORT (the port `run` serves /readyz on)",
    );
    return 2;
  }
  const port = Number(rawPort);
  if (!/^\d+$/.test(rawPort) || port < 1 || port > 65535) {
    const from = values.port === undefined ? "OUTBOX_HTTP_PORT" : "--port";
    throw new UsageError(`${from} must be a port number from 1 to 65535, got ${JSON.stringify(rawPort)}`);
  }
  const rawTimeout = values["timeout-ms"] as string | undefined;
  const timeoutMs = rawTimeout === undefined ? DEFAULT_TIMEOUT_MS : Number(rawTimeout);
  if (rawTimeout !== undefined && (!/^\d+$/.test(rawTimeout) || timeoutMs < 1)) {
    throw new UsageError(`--timeout-ms must be a positive whole number, got ${JSON.stringify(rawTimeout)}`);
  }
  const host = hostFrom(values.host as string | undefined, io.env);
  const path = values.liveness ? "/healthz" : "/readyz";
  const url = `http://${host.includes(":") ? `[${host}]` : host}:${port}${path}`;

  let status: number;
  let body: string;
  try {
    // "connection: close": no idle keep-alive socket to wait for before the process can exit.
    const response = await fetch(url, {
      signal: AbortSignal.timeout(timeoutMs),
      headers: { connection: "close" },
    });
    status = response.status;
    body = await response.text();
  } catch (error) {
    printError(io, `outbox-worker healthcheck: ${url}: ${describeFetchError(error, timeoutMs)}`);
    return 1;
  }
  if (status === 200) {
    print(io, `${path === "/readyz" ? "ready" : "alive"}: ${url} answered 200`);
    return 0;
  }
  const failing = path === "/readyz" ? failingChecks(body) : undefined;
  printError(
    io,
    `outbox-worker healthcheck: ${path === "/readyz" ? "not ready" : "not alive"}: ${url} answered ${status}${failing ? `: ${failing}` : ""}`,
  );
  return 1;
}

function hostFrom(flag: string | undefined, env: NodeJS.ProcessEnv): string {
  if (flag !== undefined && flag !== "") return flag.replace(/^\[(.*)\]$/, "$1");
  const host = env.OUTBOX_HTTP_HOST?.trim() ?? "";
  return WILDCARDS.has(host) ? "127.0.0.1" : host.replace(/^\[(.*)\]$/, "$1");
}

/** Why fetch failed, in a few words: a timeout, or the network error beneath undici's "fetch failed". */
function describeFetchError(error: unknown, timeoutMs: number): string {
  const e = error as { name?: string; message?: string; cause?: { code?: string; message?: string } };
  if (e?.name === "TimeoutError" || e?.name === "AbortError") return `no answer within ${timeoutMs} ms`;
  const cause = e?.cause;
  if (cause?.code === "ECONNREFUSED")
    return "connection refused (is `outbox-worker run` serving on this port?)";
  return cause?.message ?? cause?.code ?? e?.message ?? String(error);
}

/** The failing checks of a /readyz body, e.g. `database: connection refused; worker: stopping`. */
export function failingChecks(body: string): string | undefined {
  let report: { error?: unknown; checks?: Record<string, Record<string, unknown>> };
  try {
    report = JSON.parse(body);
  } catch {
    return undefined;
  }
  if (typeof report !== "object" || report === null) return undefined;
  if (typeof report.error === "string" && !report.checks) return report.error;
  const parts: string[] = [];
  for (const [name, check] of Object.entries(report.checks ?? {})) {
    if (typeof check !== "object" || check === null || check.ok !== false) continue;
    parts.push(`${name}: ${detail(check)}`);
  }
  return parts.length ? parts.join("; ") : undefined;
}

/** A check's reason: its error, else its pending migrations, else its state. */
function detail(check: Record<string, unknown> | undefined): string {
  if (!check) return "not ok";
  const reasons: string[] = [];
  if (typeof check.state === "string") reasons.push(check.state);
  if (Array.isArray(check.pending)) reasons.push(`pending migrations ${check.pending.join(", ")}`);
  if (typeof check.error === "string") reasons.push(check.error);
  return reasons.join(": ") || "not ok";
}
