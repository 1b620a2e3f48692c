import { createHmac } from "node:crypto";
import type { z } from "zod";
import type { MessageContext } from "../contract/handler.js";
import { PermanentError, TransientError } from "../contract/handler-errors.js";
import { redactConnectionString } from "../util/redact.js";
import { httpRelayConfigSchema, parseRelayConfig } from "./config.js";
import { RelayHealthTracker } from "./health.js";
import type { Relay, RelayDeps } from "./relay.js";

const SNIPPET_CHARS = 200;
const SNIPPET_BYTES = 2048;

/**
 * The JSON body of every request; `createdAt` is ISO 8601. The payload is spliced in as its stored JSON
 * text, byte for byte: parsing and re-serialising it would round numbers beyond 2^53.
 */
export function httpRelayBody(message: MessageContext): string {
  const { id, queue, key, headers, createdAt } = message;
  const head = JSON.stringify({ id, queue, key, headers });
  return `${head.slice(0, -1)},"payload":${message.rawPayload},"createdAt":${JSON.stringify(createdAt.toISOString())}}`;
}

/** `sha256=<hex>` of the exact body bytes: what a receiver recomputes with the shared secret. */
export function httpRelaySignature(secret: string, body: string): string {
  return `sha256=${createHmac("sha256", secret).update(body).digest("hex")}`;
}

/**
 * POSTs (or PUTs) each message as JSON. The outbox id goes in `x-outbox-id` and `idempotency-key`, so the
 * receiver can drop redeliveries; message headers travel in the body only, since arbitrary header values
 * need not be valid HTTP. 2xx acks; 408, 429, 5xx, 3xx (redirects are not followed: a POST turned into
 * a GET would "succeed" without delivering), timeouts and network errors retry; any other 4xx
 * dead-letters.
 */
export async function createHttpRelay(
  input: z.input<typeof httpRelayConfigSchema>,
  deps: RelayDeps,
): Promise<Relay> {
  const config = parseRelayConfig(httpRelayConfigSchema, input);
  const url = displayUrl(config.url);
  const target = `${config.method} ${url}`;
  const closing = new AbortController();
  // No connection to watch: the last request says whether the receiver is there.
  const health = new RelayHealthTracker(target, { initial: "ok" });
  deps.logger.child({ relay: "http" }).info({ target }, "http relay ready");

  const handler = async (_payload: unknown, message: MessageContext): Promise<void> => {
    if (closing.signal.aborted) throw new TransientError(`${target}: relay is closed`);
    const body = httpRelayBody(message);
    const headers = new Headers(config.headers);
    headers.set("content-type", "application/json");
    headers.set("x-outbox-id", message.id);
    headers.set("idempotency-key", message.id);
    if (config.hmacSecret !== undefined)
      headers.set(config.hmacHeader, httpRelaySignature(config.hmacSecret, body));
    const signal = AbortSignal.any([message.signal, closing.signal, AbortSignal.timeout(config.timeoutMs)]);

    let response: Response;
    try {
      response = await fetch(config.url, {
        method: config.method,
        headers,
        body,
        redirect: "manual",
        signal,
      });
    } catch (error) {
      const failure = new TransientError(`${target}: ${failureReason(error, config.timeoutMs)}`, {
        cause: error,
      });
      if (!closing.signal.aborted && !message.signal.aborted) health.unreachable(failure);
      throw failure;
    }
    // Any answer, even a refusal, means the receiver is there.
    health.ok();
    const { status } = response;
    if (status >= 200 && status < 300) {
      // Unread bodies keep the pooled socket busy until garbage collection.
      await response.body?.cancel().catch(() => {});
      return;
    }
    const snippet = await readSnippet(response);
    const detail = `${target} answered ${status}${snippet === "" ? "" : `: ${snippet}`}`;
    if (status >= 300 && status < 400) throw new TransientError(`${detail} (redirects are not followed)`);
    if (status >= 400 && status < 500 && status !== 408 && status !== 429) throw new PermanentError(detail);
    throw new TransientError(detail);
  };

  return {
    kind: "http",
    handler,
    health: async () => health.snapshot(),
    close: async () => {
      closing.abort(new Error("relay closed"));
    },
  };
}

/** The URL for logs and errors: a query string may carry a token, so only its presence is shown. */
function displayUrl(url: string): string {
  const parsed = new URL(redactConnectionString(url));
  if (parsed.search === "") return parsed.toString();
  parsed.search = "";
  return `${parsed.toString()}?…`;
}

function failureReason(error: unknown, timeoutMs: number): string {
  const name = error instanceof Error ? error.name : "";
  if (name === "TimeoutError") return `no response within ${timeoutMs} ms`;
  if (name === "AbortError") return "aborted";
  return "request failed";
}

/** At most SNIPPET_CHARS of the response body, on one line; never throws. */
async function readSnippet(response: Response): Promise<string> {
  const reader = response.body?.getReader();
  if (reader === undefined) return "";
  const chunks: Uint8Array[] = [];
  let size = 0;
  try {
    while (size < SNIPPET_BYTES) {
      const { done, value } = await reader.read();
      if (done) break;
      chunks.push(value);
      size += value.byteLength;
    }
  } catch {
    // A body cut short still tells something; the status is the main point anyway.
  } finally {
    reader.cancel().catch(() => {});
  }
  const text = new TextDecoder().decode(Buffer.concat(chunks).subarray(0, SNIPPET_BYTES));
  const line = text.replace(/\s+/g, " ").trim();
  return line.length > SNIPPET_CHARS ? `${line.slice(0, SNIPPET_CHARS - 1)}…` : line;
}
