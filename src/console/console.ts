import type { IncomingMessage, ServerResponse } from "node:http";
import type { Logger } from "pino";
import type { Executor } from "../sql/executor.js";
import { createApi, isClientError, readJsonBody } from "./api.js";
import { type ConsoleTokens, checkRead, checkWrite, type Refusal } from "./auth.js";
import type { History } from "./history.js";
import { consoleHtml } from "./page-html.js";
import { RELAYS_SCRIPT } from "./page-relays-script.js";
import { CONSOLE_SCRIPT } from "./page-script.js";
import { CONSOLE_STYLE } from "./page-style.js";
import { sendJson, sendText } from "./respond.js";

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
}

/** Serves the page, its script and style, and the JSON API under one prefix. */
export interface ConsoleHandler {
  readonly pathPrefix: string;
  /** Whether this path is the console's (the prefix itself or below it). */
  owns(path: string): boolean;
  handle(req: IncomingMessage, res: ServerResponse, path: string): Promise<void>;
}

const DEAD_LETTER_PATH = /^\/api\/dead-letters\/([^/]+)$/;

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

  const refuse = (res: ServerResponse, refusal: Refusal) =>
    sendJson(
      res,
      refusal.status,
      { error: refusal.error },
      refusal.status === 401 ? { "www-authenticate": 'Bearer realm="outbox-console"' } : {},
    );

  const methodNotAllowed = (res: ServerResponse, allow: string) =>
    sendJson(res, 405, { error: "method not allowed" }, { allow });

  async function route(req: IncomingMessage, res: ServerResponse, sub: string): Promise<void> {
    const method = req.method ?? "GET";
    // The page, script and style hold no data: served openly, so the page can ask for a token.
    const asset = ASSETS.get(sub);
    if (sub === "") {
      // Relative to "<prefix>/", the page's links resolve under the prefix.
      res.writeHead(308, { location: `${prefix}/`, "content-length": "0" });
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
      const refusal = checkWrite(req, tokens);
      if (refusal) return refuse(res, refusal);
      const body = await readJsonBody(req);
      const result = sub.endsWith("/replay") ? await api.replay(body) : await api.purge(body);
      if (!result.dryRun) {
        opts.logger?.info({ action: sub.slice("/api/dead-letters/".length), body: result }, "console write");
      }
      return sendJson(res, 200, result);
    }
    if (method !== "GET") return methodNotAllowed(res, "GET");
    const refusal = checkRead(req, tokens);
    if (refusal) return refuse(res, refusal);
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
      try {
        await route(req, res, path.slice(prefix.length));
      } catch (error) {
        if (res.headersSent) {
          res.destroy();
          return;
        }
        if (isClientError(error)) return sendJson(res, 400, { error: error.message });
        // The message may name tables or connections: logged here, a generic line to the page.
        opts.logger?.warn({ err: error, path }, "console request failed");
        sendJson(res, 500, { error: "internal error (see the service log)" });
      }
    },
  };
}
