import type { z } from "zod";
import { OutboxError } from "../contract/errors.js";
import type { MessageContext } from "../contract/handler.js";
import { PermanentError, TransientError } from "../contract/handler-errors.js";
import { redactConnectionString } from "../util/redact.js";
import { plainHeaderValue, traceHeaderValue } from "../wire/header-encoding.js";
import { webhookSignature } from "../wire/webhook-signature.js";
import {
  binaryAttributes,
  type CloudEventNaming,
  cloudEventAttributes,
  encodeHeaderValue,
  eventNaming,
  isEventAttribute,
} from "./cloudevents.js";
import { httpRelayConfigSchema, parseRelayConfig, signingKey } from "./config.js";
import { RelayHealthTracker } from "./health.js";
import type { Relay, RelayDeps } from "./relay.js";

// Shared with the consumer inbox, which verifies what the relay signs.
export { webhookSignature };

const SNIPPET_CHARS = 200;
const SNIPPET_BYTES = 2048;

/** An RFC 9110 token: what may be sent as a header name. */
const HTTP_TOKEN = /^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/;

/**
 * Why a message header that is not a CloudEvents extension cannot go as a plain HTTP header of that name,
 * or null when it can. Such names would change how the request is framed or read: the body's own
 * description, hop-by-hop fields, and the prefixes a receiver reads as event attributes or signatures.
 */
function plainHeaderProblem(name: string): string | null {
  if (!HTTP_TOKEN.test(name)) return "not a valid HTTP header name";
  const lower = name.toLowerCase();
  if (lower.startsWith("ce-")) return "a receiver would read it as a CloudEvents attribute";
  if (lower.startsWith("webhook-")) return "Standard Webhooks reserves the webhook- prefix";
  if (lower.startsWith("content-") || FRAMING.has(lower)) return "it would change how the request is read";
  return null;
}

const FRAMING = new Set([
  "host",
  "connection",
  "keep-alive",
  "transfer-encoding",
  "te",
  "trailer",
  "upgrade",
  "expect",
  "proxy-connection",
]);

/**
 * The request headers for one message, relay's own last so nothing overrides them: the CloudEvents
 * binary-mode attributes (`ce-*`, percent-encoded), trace context, the message headers that are not
 * extensions as plain headers (as they are where HTTP carries them), `idempotency-key` = outbox id. Throws a PermanentError naming each message
 * header that cannot be sent as it is, so it dead-letters, whole, rather than reach the receiver without it.
 */
export function httpRelayHeaders(
  message: MessageContext,
  naming: CloudEventNaming,
  staticHeaders: Record<string, string> | undefined,
): Headers {
  const attributes = cloudEventAttributes(message, naming);
  const own = new Headers();
  own.set("content-type", attributes.datacontenttype);
  own.set("idempotency-key", message.id);
  for (const [name, value] of binaryAttributes(attributes)) own.set(`ce-${name}`, encodeHeaderValue(value));
  // Both: the W3C headers continue the trace in HTTP middleware (OpenTelemetry's instrumentation reads only
  // them); ce-traceparent is the distributed-tracing extension, which on a single hop must carry the same.
  for (const name of ["traceparent", "tracestate"] as const) {
    const value = attributes[name];
    if (value !== undefined) own.set(name, traceHeaderValue(value));
  }

  const headers = new Headers(staticHeaders);
  const problems: string[] = [];
  const seen = new Set<string>();
  for (const [name, value] of Object.entries(message.headers)) {
    if (isEventAttribute(name)) continue;
    const lower = name.toLowerCase();
    const problem =
      plainHeaderProblem(name) ??
      (own.has(lower) ? "the relay sets that header itself" : null) ??
      (seen.has(lower) ? "another message header differs from it only in case" : null) ??
      (staticHeaders !== undefined && headers.has(lower) ? "the relay config sets that header" : null);
    if (problem !== null) {
      problems.push(`${JSON.stringify(name)} (${problem})`);
      continue;
    }
    seen.add(lower);
    headers.set(lower, plainHeaderValue(value));
  }
  if (problems.length > 0) {
    throw new PermanentError(`message header ${problems.join(", ")} cannot be sent as an HTTP header`);
  }
  for (const [name, value] of own) headers.set(name, value);
  return headers;
}

/**
 * POSTs (or PUTs) each message as a CloudEvent in the HTTP binding's binary content mode: the body is the
 * payload's stored JSON text byte for byte (re-serialising would round numbers beyond 2^53), the context
 * attributes are `ce-*` headers. With `signingSecret`, Standard Webhooks headers sign it; `webhook-id`,
 * `ce-id` and `idempotency-key` all hold the outbox id, so the receiver can drop redeliveries. 2xx acks;
 * 408, 429, 5xx, 3xx (redirects are not followed: a POST turned into a GET would "succeed" without
 * delivering), timeouts and network errors retry; any other 4xx dead-letters.
 */
export async function createHttpRelay(
  input: z.input<typeof httpRelayConfigSchema>,
  deps: RelayDeps,
): Promise<Relay> {
  const config = parseRelayConfig(httpRelayConfigSchema, input);
  const url = displayUrl(config.url);
  const target = `${config.method} ${url}`;
  const naming = eventNaming(config, deps);
  const secrets =
    config.signingSecret === undefined
      ? []
      : Array.isArray(config.signingSecret)
        ? config.signingSecret
        : [config.signingSecret];
  // The schema has checked every secret: the key is there.
  const keys = secrets.map((secret) => signingKey(secret) ?? Buffer.alloc(0));
  const closing = new AbortController();
  // No connection to watch: the last request says whether the receiver is there.
  const health = new RelayHealthTracker(target, { initial: "ok" });
  deps.logger
    .child({ relay: "http" })
    .info({ target, source: naming.source, signingKeys: keys.length }, "http relay ready");

  const handler = async (_payload: unknown, message: MessageContext): Promise<void> => {
    if (closing.signal.aborted) throw new TransientError(`${target}: relay is closed`);
    const body = message.rawPayload;
    const headers = httpRelayHeaders(message, naming, config.headers);
    if (keys.length > 0) {
      // Signed at send time, every attempt anew: the receiver refuses a timestamp older than its tolerance.
      const timestamp = Math.floor(Date.now() / 1000);
      headers.set("webhook-id", message.id);
      headers.set("webhook-timestamp", String(timestamp));
      headers.set("webhook-signature", webhookSignature(keys, message.id, timestamp, body));
    }
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
      closing.abort(new OutboxError("relay closed"));
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
