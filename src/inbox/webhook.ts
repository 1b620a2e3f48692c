import type { IncomingMessage, ServerResponse } from "node:http";
import { z } from "zod";
import { OutboxConfigError } from "../contract/errors.js";
import { signingKey, verifyWebhookSignature } from "../wire/webhook-signature.js";
import { type InboxEvent, MalformedEventError } from "./event.js";
import { decodeBody, decodeHttpEvent, headerValue } from "./http-event.js";
import type { Inbox, InboxResult } from "./inbox.js";
import type { InboxClient } from "./options.js";
import { parseOptions } from "./options.js";

const secret = z
  .string()
  .refine(
    (s) => signingKey(s) !== null,
    "must be a Standard Webhooks secret: whsec_ followed by the base64 of a 24 to 64-byte key",
  );

const webhookOptionsSchema = z.strictObject({
  signingSecret: z.union([secret, z.array(secret).min(1).max(10)], {
    error: "must be a whsec_<base64> secret, or a list of 1 to 10 of them (while rotating)",
  }),
  toleranceSeconds: z.number().int().min(1).max(3600).default(300),
  maxBodyBytes: z
    .number()
    .int()
    .min(1)
    .max(64 * 1024 * 1024)
    .default(1024 * 1024),
  handler: z.custom<(...args: never[]) => unknown>((v) => typeof v === "function", "must be a function"),
  onError: z
    .custom<(...args: never[]) => unknown>((v) => typeof v === "function", "must be a function")
    .optional(),
  now: z.custom<() => number>((v) => typeof v === "function", "must be a function").optional(),
});

/** Options of {@link createWebhookHandler}. */
export interface WebhookOptions<C extends InboxClient, T = unknown> {
  /** The relay's `signingSecret` (`whsec_…`), or several while rotating: a request signed by any verifies. */
  signingSecret: string | string[];
  /** How far a request's `webhook-timestamp` may be from this clock, either way; default 300 (5 minutes). */
  toleranceSeconds?: number;
  /** Larger bodies are refused (413); default 1 MiB. */
  maxBodyBytes?: number;
  /** Your effects, in the inbox's transaction on `client`: runs once per event id. */
  handler: (event: InboxEvent, client: C) => Promise<T> | T;
  /** Told of each handler or database failure (answered 500, so the relay retries); log it here. */
  onError?: (error: unknown, event: InboxEvent) => void;
  /** The clock, ms since the epoch; default Date.now. */
  now?: () => number;
}

/** A node:http request listener; with express, `app.post(path, handler)` (before any body parser). */
export type WebhookHandler = (req: IncomingMessage, res: ServerResponse, next?: unknown) => void;

/**
 * A request handler for the http relay's webhooks: verifies the Standard Webhooks signature and timestamp,
 * decodes the CloudEvent, and runs `handler` through `inbox.handle`. Answers:
 * - 200 `{"id","duplicate":false}` once the handler's transaction committed; 200 `{"duplicate":true}` for
 *   an event handled before (the relay stops retrying either way);
 * - 401 for a missing, wrong or stale signature (the relay dead-letters: check its secret and clocks);
 * - 400 for a request that is no CloudEvent of ours, 413 for a body over `maxBodyBytes`, 405 for a method
 *   other than POST or PUT (all dead-lettered by the relay);
 * - 500 when the handler or the database failed: nothing committed, and the relay retries.
 *
 * The signature covers `webhook-id`, the timestamp and the body, not the `ce-*` headers: a binary-mode
 * event whose `ce-id` differs from the signed `webhook-id` is refused (400), so the dedupe key is signed.
 * The inbox's retention must exceed the tolerance: a replay is then either refused as stale or deduped.
 */
export function createWebhookHandler<C extends InboxClient, T = unknown>(
  inbox: Inbox<C>,
  options: WebhookOptions<C, T>,
): WebhookHandler {
  const config = parseOptions(webhookOptionsSchema, options, "webhook");
  if (inbox.retentionMs < config.toleranceSeconds * 1000) {
    throw new OutboxConfigError(
      "webhook.toleranceSeconds",
      `must not exceed the inbox's retention (${inbox.retentionMs} ms): a replay within the tolerance must still find its record`,
    );
  }
  const secrets = Array.isArray(config.signingSecret) ? config.signingSecret : [config.signingSecret];
  const keys = secrets.map((s) => signingKey(s) ?? Buffer.alloc(0));
  const now = config.now ?? Date.now;
  const handler = options.handler;

  return (req, res) => {
    if (req.method !== "POST" && req.method !== "PUT") {
      answer(res, 405, { error: "method not allowed: POST or PUT" }, { allow: "POST, PUT" });
      req.resume();
      return;
    }
    if (req.readableEnded) {
      // A body parser ran first: the raw bytes the signature covers are gone, and 'end' will not come again.
      answer(res, 500, {
        error: "request body already read: mount the inbox's handler before any body parser",
      });
      return;
    }
    readBody(req, config.maxBodyBytes).then(
      (bytes) => respond(req, res, bytes).catch(() => answer(res, 500, { error: "internal error" })),
      () => {
        // The request stream failed (the client went away): nothing to answer.
        req.destroy();
      },
    );
  };

  async function respond(req: IncomingMessage, res: ServerResponse, bytes: Buffer | null): Promise<void> {
    if (bytes === null) return answer(res, 413, { error: "body too large" }, { connection: "close" });
    const problem = verifyWebhookSignature(
      keys,
      {
        id: headerValue(req.headers, "webhook-id"),
        timestamp: headerValue(req.headers, "webhook-timestamp"),
        signature: headerValue(req.headers, "webhook-signature"),
      },
      bytes,
      { toleranceSeconds: config.toleranceSeconds, nowSeconds: Math.floor(now() / 1000) },
    );
    if (problem !== null) return answer(res, 401, { error: `signature refused: ${problem}` });
    let event: InboxEvent;
    try {
      event = decodeHttpEvent(req.headers, decodeBody(bytes));
      if (event.id !== headerValue(req.headers, "webhook-id")) {
        throw new MalformedEventError("ce-id", "differs from webhook-id (the id the signature covers)");
      }
    } catch (error) {
      if (error instanceof MalformedEventError) return answer(res, 400, { error: error.message });
      throw error;
    }
    let outcome: InboxResult<T>;
    try {
      outcome = await inbox.handle(event, handler);
    } catch (error) {
      options.onError?.(error, event);
      // No detail: the relay logs the answer, and a handler's error may hold what it should not.
      return answer(res, 500, { error: "handler failed; nothing was committed" });
    }
    answer(res, 200, { id: event.id, duplicate: outcome.duplicate });
  }
}

function answer(
  res: ServerResponse,
  status: number,
  body: object,
  headers: Record<string, string> = {},
): void {
  if (res.headersSent || res.destroyed) return;
  res.writeHead(status, { "content-type": "application/json", ...headers }).end(JSON.stringify(body));
}

/** The body's bytes, or null once it passes `limit` (the rest is not read). */
function readBody(req: IncomingMessage, limit: number): Promise<Buffer | null> {
  return new Promise((resolve, reject) => {
    const declared = Number(req.headers["content-length"]);
    if (Number.isFinite(declared) && declared > limit) return resolve(null);
    const chunks: Buffer[] = [];
    let size = 0;
    req.on("data", (chunk: Buffer) => {
      size += chunk.length;
      if (size > limit) {
        req.removeAllListeners("data");
        req.resume();
        resolve(null);
        return;
      }
      chunks.push(chunk);
    });
    req.on("end", () => resolve(Buffer.concat(chunks)));
    req.on("error", reject);
  });
}
