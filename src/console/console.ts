import type { IncomingMessage, ServerResponse } from "node:http";
import type { Logger } from "pino";
import type { Executor } from "../sql/executor.js";
import { createApi, isClientError, readJsonBody } from "./api.js";
import { type ConsoleTokens, checkRead, checkWrite, type Refusal } from "./auth.js";
import { CONSOLE_SCRIPT, RELAYS_SCRIPT } from "./browser-scripts.js";
import type { History } from "./history.js";
import { checkHost, checkOrigin, type HostRefusal } from "./host-check.js";
import { unavailableReason } from "./outage.js";
import { consoleHtml } from "./page-html.js";
import { CONSOLE_STYLE } from "./page-style.js";
import { createRefusalLog } from "./refusal-log.js";
import { SECURITY_HEADERS, sendJson, sendText } from "./respond.js";
import { describeWrite } from "./write-log.js";

export interface ConsoleOptions extends ConsoleTokens {
  /** Read and replay/purge through this (its own small pool in the service: never the worker's). */
  db: Executor;
  schema: string;
  /** Starts with "/", no trailing slash (validated by the config). */
  pathPrefix: string;
  history?: History;
  /** Each built-in relay's reach (the service's `/relays` report), for the relay panel. */
  relays?: { check(): Promise<unknown> };
  logger?: Logger;
  /** The address the HTTP server binds (http.host), default 127.0.0.1: a Host naming it is this server. */
  bindHost?: string;
  /** Other names the console is reached by (a proxy's, an ingress's): console.allowedHosts. */
  allowedHosts?: readonly string[];
  /** How a 503 names the database while it is down, e.g. `database "app" at db:5432`; no credentials. */
  database?: string;
}

/** Serves the page, its script and style, and the JSON API under one prefix. */
export interface ConsoleHandler {
  readonly pathPrefix: string;
  /** Whether this path is the console's (the prefix itself or below it). */
  owns(path: string): boolean;
  handle(req: IncomingMessage, res: ServerResponse, path: string): Promise<void>;
  /** Log what the refusal log still holds back, and stop its timers. */
  close(): void;
}

const DEAD_LETTER_PATH = /^\/api\/dead-letters\/([^/]+)$/;
const MESSAGE_PATH = /^\/api\/messages\/([^/]+)$/;
/** How often an outage is logged while requests keep failing: the 503s say the rest. */
const OUTAGE_LOG_MS = 60_000;

/** The static files under the prefix; the page's body (undefined here) depends on the prefix. */
const ASSETS = new Map<string, { type: string; body?: string }>([
  ["/", { type: "text/html; charset=utf-8" }],
  ["/console.js", { type: "text/javascript; charset=utf-8", body: CONSOLE_SCRIPT }],
  ["/console.css", { type: "text/css; charset=utf-8", body: CONSOLE_STYLE }],
  ["/relays.js", { type: "text/javascript; charset=utf-8", body: RELAYS_SCRIPT }],
]);

export function createConsole(opts: ConsoleOptions): ConsoleHandler {
  const prefix = opts.pathPrefix;
  const api = createApi({ db: opts.db, schema: opts.schema, history: opts.history });
  const tokens: ConsoleTokens = { readToken: opts.readToken, writeToken: opts.writeToken };
  const html = consoleHtml(prefix);
  const hostRules = { bindHost: opts.bindHost ?? "127.0.0.1", allowedHosts: opts.allowedHosts ?? [] };
  const refusals = createRefusalLog(opts.logger);
  const database = opts.database ?? "the database";
  let outageLoggedAt = Number.NEGATIVE_INFINITY;

  const clientOf = (req: IncomingMessage) => req.socket.remoteAddress ?? "unknown";
  const refuseHost = (req: IncomingMessage, res: ServerResponse, path: string, refusal: HostRefusal) => {
    refusals.record({
      client: clientOf(req),
      kind: "host",
      method: req.method ?? "GET",
      path,
      status: refusal.status,
      error: refusal.error,
    });
    sendJson(res, refusal.status, { error: refusal.error });
  };

  const refuse = (req: IncomingMessage, res: ServerResponse, sub: string, refusal: Refusal) => {
    if (refusal.wrongToken) {
      refusals.record({
        client: clientOf(req),
        kind: "token",
        method: req.method ?? "GET",
        path: `${prefix}${sub}`,
        status: refusal.status,
        error: refusal.error,
      });
    }
    sendJson(
      res,
      refusal.status,
      { error: refusal.error },
      refusal.status === 401 ? { "www-authenticate": 'Bearer realm="outbox-console"' } : {},
    );
  };

  const methodNotAllowed = (res: ServerResponse, allow: string) =>
    sendJson(res, 405, { error: "method not allowed" }, { allow });

  async function route(req: IncomingMessage, res: ServerResponse, sub: string): Promise<void> {
    const method = req.method ?? "GET";
    // The page, script and style hold no data: served openly, so the page can ask for a token.
    const asset = ASSETS.get(sub);
    if (sub === "") {
      // Relative to "<prefix>/", the page's links resolve under the prefix.
      res.writeHead(308, { ...SECURITY_HEADERS, location: `${prefix}/`, "content-length": "0" });
      res.end();
      return;
    }
    if (asset) {
      if (method !== "GET" && method !== "HEAD") return methodNotAllowed(res, "GET, HEAD");
      return sendText(res, 200, asset.type, asset.body ?? html);
    }
    if (!sub.startsWith("/api/")) return sendJson(res, 404, { error: "not found" });

    const url = new URL(req.url ?? "/", "http://localhost");
    const writes = sub === "/api/dead-letters/replay" || sub === "/api/dead-letters/purge";
    if (writes) {
      if (method !== "POST") return methodNotAllowed(res, "POST");
      const badOrigin = checkOrigin(req, hostRules);
      if (badOrigin) return refuseHost(req, res, `${prefix}${sub}`, badOrigin);
      const refusal = checkWrite(req, tokens);
      if (refusal) return refuse(req, res, sub, refusal);
      const body = await readJsonBody(req);
      const action = sub.endsWith("/replay") ? "replay" : "purge";
      const result = action === "replay" ? await api.replay(body) : await api.purge(body);
      if (!result.dryRun) {
        opts.logger?.info(
          { client: clientOf(req), action, ...describeWrite(body, result) },
          `console ${action}`,
        );
      }
      return sendJson(res, 200, result);
    }
    if (method !== "GET") return methodNotAllowed(res, "GET");
    const refusal = checkRead(req, tokens);
    if (refusal) return refuse(req, res, sub, refusal);
    if (sub === "/api/status") {
      // Whether replay/purge can work at all, so the page can say so up front; never the token.
      return sendJson(res, 200, await api.status(tokens.writeToken !== undefined));
    }
    if (sub === "/api/workers") return sendJson(res, 200, await api.workers());
    if (sub === "/api/relays") {
      return sendJson(res, 200, (await opts.relays?.check()) ?? { ok: true, relays: {} });
    }
    if (sub === "/api/peek") return sendJson(res, 200, await api.peek(url.searchParams));
    if (sub === "/api/dead-letters") return sendJson(res, 200, await api.deadLetters(url.searchParams));
    const message = MESSAGE_PATH.exec(sub);
    if (message?.[1]) {
      const row = await api.message(message[1]);
      return row
        ? sendJson(res, 200, row)
        : sendJson(res, 404, {
            error: "no unprocessed message with this id (delivered or dead-lettered since?)",
          });
    }
    const one = DEAD_LETTER_PATH.exec(sub);
    if (one?.[1]) {
      // Raw, not decoded: an id is digits, and checkMessageId refuses anything else as a 400.
      const row = await api.deadLetter(one[1]);
      return row ? sendJson(res, 200, row) : sendJson(res, 404, { error: "no dead letter with this id" });
    }
    return sendJson(res, 404, { error: "not found" });
  }

  return {
    pathPrefix: prefix,
    owns: (path) => path === prefix || path.startsWith(`${prefix}/`),
    async handle(req, res, path) {
      // Before anything, the page included: a page of another site whose name was re-pointed here
      // (DNS rebinding) sends its own name as Host.
      const badHost = checkHost(req, hostRules);
      if (badHost) return refuseHost(req, res, path, badHost);
      try {
        await route(req, res, path.slice(prefix.length));
      } catch (error) {
        if (res.headersSent) {
          res.destroy();
          return;
        }
        if (isClientError(error)) return sendJson(res, 400, { error: error.message });
        const reason = unavailableReason(error);
        if (reason !== undefined) {
          if (Date.now() - outageLoggedAt >= OUTAGE_LOG_MS) {
            outageLoggedAt = Date.now();
            opts.logger?.warn({ err: error, path, database }, "console: the database is unavailable");
          }
          return sendJson(
            res,
            503,
            { error: `${database} is unavailable (${reason})`, database, reason },
            { "retry-after": "5" },
          );
        }
        // The message may name tables or connections: logged here, a generic line to the page.
        opts.logger?.warn({ err: error, path }, "console request failed");
        sendJson(res, 500, { error: "internal error (see the service log)" });
      }
    },
    close: () => refusals.close(),
  };
}
