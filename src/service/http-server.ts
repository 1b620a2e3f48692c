import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import pino, { type Logger } from "pino";
import type { Registry } from "prom-client";
import type { ConsoleHandler } from "../console/console.js";

export interface HttpServerOptions {
  /** 0 picks a free port; the real one is returned. */
  port: number;
  /** Default 127.0.0.1 (DEFAULT_HOST): a container or a remote scrape asks for more on purpose. */
  host?: string;
  metrics: { registry: Registry };
  readiness: { check(): Promise<{ ready: boolean }> };
  /** Served at /relays (a report, always 200); without it, /relays reports no relay. */
  relays?: { check(): Promise<unknown> };
  logger?: Logger;
  /** The operator console, served under its own prefix when given. */
  console?: ConsoleHandler;
  /** How long close() lets requests in flight finish before cutting their connections. */
  closeGraceMs?: number;
}

export interface HttpServer {
  readonly port: number;
  /** Stops accepting, then ends every connection within the grace period. Idempotent. */
  close(): Promise<void>;
}

const DEFAULT_CLOSE_GRACE_MS = 2000;
/** Loopback: metrics, probes and the console are not for the network unless the config says so. */
export const DEFAULT_HOST = "127.0.0.1";
/** Every path the server answers itself; the console's prefix may shadow none (config.ts says so). */
export const SERVICE_PATHS: readonly string[] = ["/healthz", "/readyz", "/relays", "/metrics"];
const ROUTES = new Set(SERVICE_PATHS);

function send(res: ServerResponse, status: number, contentType: string, body: string) {
  res.writeHead(status, {
    "content-type": contentType,
    "content-length": Buffer.byteLength(body),
    "cache-control": "no-store",
  });
  res.end(body);
}

const json = (res: ServerResponse, status: number, value: unknown) =>
  send(res, status, "application/json; charset=utf-8", JSON.stringify(value));

/** /healthz, /readyz, /relays and /metrics on node:http, and the console under its prefix when on: nothing else. */
export function startHttpServer(opts: HttpServerOptions): Promise<HttpServer> {
  const log = opts.logger ?? pino({ name: "outbox-http" });
  const graceMs = opts.closeGraceMs ?? DEFAULT_CLOSE_GRACE_MS;

  async function route(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const path = new URL(req.url ?? "/", "http://localhost").pathname;
    if (opts.console?.owns(path)) return opts.console.handle(req, res, path);
    if (!ROUTES.has(path)) return json(res, 404, { error: "not found" });
    if (req.method !== "GET") {
      res.setHeader("allow", "GET");
      return json(res, 405, { error: "method not allowed" });
    }
    if (path === "/healthz") return json(res, 200, { status: "ok" });
    if (path === "/readyz") {
      try {
        const report = await opts.readiness.check();
        return json(res, report.ready ? 200 : 503, report);
      } catch (error) {
        log.warn({ err: error }, "readiness check failed");
        return json(res, 503, { ready: false, error: "readiness check failed" });
      }
    }
    // 200 whatever the relays say: a report for people and dashboards, never a probe (README says why).
    if (path === "/relays") return json(res, 200, (await opts.relays?.check()) ?? { ok: true, relays: {} });
    const body = await opts.metrics.registry.metrics();
    return send(res, 200, opts.metrics.registry.contentType, body);
  }

  const server = createServer((req, res) => {
    route(req, res).catch((error: unknown) => {
      log.warn({ err: error, url: req.url }, "service endpoint failed");
      if (!res.headersSent) json(res, 500, { error: "internal error" });
      else res.destroy();
    });
  });

  return new Promise((resolve, reject) => {
    server.once("error", reject);
    const host = opts.host ?? DEFAULT_HOST;
    server.listen(opts.port, host, () => {
      server.off("error", reject);
      server.on("error", (error) => log.warn({ err: error }, "service http server error"));
      const { port } = server.address() as AddressInfo;
      log.debug({ port, host }, "service endpoints listening");
      let closing: Promise<void> | undefined;
      resolve({
        port,
        close() {
          closing ??= new Promise<void>((done) => {
            const timer = setTimeout(() => server.closeAllConnections(), graceMs);
            server.close(() => {
              clearTimeout(timer);
              done();
            });
            // Idle keep-alive sockets would otherwise hold close() open until they time out.
            server.closeIdleConnections();
          });
          return closing;
        },
      });
    });
  });
}
