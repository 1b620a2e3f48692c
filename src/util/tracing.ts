/**
 * OpenTelemetry tracing through `@opentelemetry/api` alone, an optional peer dependency. The API is
 * imported once, lazily, on first use; without it every function here is a no-op and nothing is loaded.
 * With it but no SDK registered, the worker's check per message is two property reads: no span, no
 * context, no allocation.
 *
 * Lives in util/ because both the producer (produce/) and the worker (dispatch/) use it, and it imports
 * nothing of this package.
 */

// A type-only import: erased from the JavaScript, so it loads nothing.
type Api = typeof import("@opentelemetry/api");
type Span = import("@opentelemetry/api").Span;

/** `undefined`: not tried yet; `null`: not installed (or failed to load). */
let api: Api | null | undefined;
let loading: Promise<Api | null> | undefined;
/** The API's no-op provider: the global proxy delegates to it until an SDK registers one. */
let noopProvider: unknown;
/** The tracer of the provider it came from, made again when another provider is registered. */
let tracer: { provider: unknown; tracer: import("@opentelemetry/api").Tracer } | undefined;

/** Loads `@opentelemetry/api` once; resolves with `null` when it is not installed. */
export function loadTracing(): Promise<unknown> {
  loading ??= import("@opentelemetry/api").then(
    (module) => {
      noopProvider = new module.ProxyTracerProvider().getDelegate();
      api = module;
      return module;
    },
    () => {
      api = null;
      return null;
    },
  );
  return loading;
}

/** Whether {@link loadTracing} has settled: then the functions below answer synchronously. */
export function tracingLoaded(): boolean {
  return api !== undefined;
}

/** The W3C `traceparent` header name, in any case: a caller's own one says which context the message is in. */
function hasTraceparent(headers: Record<string, string>): boolean {
  for (const name in headers) if (name.toLowerCase() === "traceparent") return true;
  return false;
}

let injected: Record<string, string> | undefined;
/** One setter for every publish: the carrier is only made when the propagator writes something. */
const setter = {
  set(_carrier: unknown, key: string, value: string) {
    if (typeof value !== "string") return;
    injected ??= {};
    injected[key] = value;
  },
};

/**
 * The message headers with the active context injected by the global propagator (`traceparent`,
 * `tracestate`, `baggage`…). A caller's own `traceparent` wins: then nothing is injected, since the
 * injected `tracestate` or `baggage` would belong to another trace. The caller's other headers win over
 * injected ones of the same name. Returns `headers` itself when nothing was injected.
 */
export function withTraceContext(
  headers: Record<string, string> | undefined,
): Record<string, string> | undefined {
  const otel = api;
  if (!otel || (headers && hasTraceparent(headers))) return headers;
  injected = undefined;
  otel.propagation.inject(otel.context.active(), {}, setter);
  // The setter filled it: TypeScript cannot see that through the call.
  const carrier = injected as Record<string, string> | undefined;
  injected = undefined;
  if (!carrier) return headers;
  return headers ? { ...carrier, ...headers } : carrier;
}

/** `messaging.system`: not a broker semconv lists, and not `postgresql` (that names database spans). */
export const MESSAGING_SYSTEM = "pg_outbox";
const NS = `messaging.${MESSAGING_SYSTEM}`;

/** What the worker knows of a message when its handler starts. */
export interface TracedMessage {
  id: string;
  queue: string;
  key: string | null;
  headers: Record<string, string>;
  deliveries: number;
}

/** A started CONSUMER span and the context to run the handler in. */
export interface ProcessSpan {
  readonly span: Span;
  readonly context: unknown;
}

/** How a handler run ended, as the dispatcher decided it. */
export type ProcessOutcome =
  | { kind: "ack" }
  | { kind: "retry"; delayMs: number }
  | { kind: "dead"; reason: string };

/**
 * Starts the CONSUMER span `process <queue>` (OpenTelemetry messaging semantic conventions) for one
 * delivery, or returns `undefined` when tracing is off (API absent, or no SDK registered).
 */
export function startProcessSpan(message: TracedMessage): ProcessSpan | undefined {
  const otel = api;
  if (!otel) return undefined;
  const provider = otel.trace.getTracerProvider();
  // No SDK: the global proxy still delegates to the no-op provider. Checked per message (cheap) so an SDK
  // registered after the worker started is picked up.
  if (provider instanceof otel.ProxyTracerProvider && provider.getDelegate() === noopProvider)
    return undefined;
  if (tracer?.provider !== provider) tracer = { provider, tracer: otel.trace.getTracer("pg-outbox-worker") };
  // The message's own context only, from its headers: never the dispatch loop's.
  const producer = otel.propagation.extract(otel.ROOT_CONTEXT, message.headers);
  const creation = otel.trace.getSpanContext(producer);
  const attributes: Record<string, string | number> = {
    "messaging.system": MESSAGING_SYSTEM,
    "messaging.operation.type": "process",
    "messaging.operation.name": "process",
    "messaging.destination.name": message.queue,
    "messaging.message.id": message.id,
    // Semconv has no system-neutral delivery count (Service Bus has its own): ours, under our system's name.
    [`${NS}.message.delivery_count`]: message.deliveries,
  };
  if (message.key !== null) attributes[`${NS}.message.key`] = message.key;
  // One message per span, so semconv allows the creation context as parent: the handler's work then sits
  // in the producer's trace, where one looks for it. The link is what semconv requires of a process span
  // (and what stays meaningful if a backend cuts long traces).
  const span = tracer.tracer.startSpan(
    `process ${message.queue}`,
    {
      kind: otel.SpanKind.CONSUMER,
      attributes,
      links: creation && otel.isSpanContextValid(creation) ? [{ context: creation }] : undefined,
    },
    producer,
  );
  return { span, context: otel.trace.setSpan(producer, span) };
}

/** Runs `fn` with the process span active, so the handler's own spans and outgoing calls are its children. */
export function runInSpan<T>(process: ProcessSpan, fn: () => T): T {
  return (api as Api).context.with(process.context as import("@opentelemetry/api").Context, fn);
}

/** Ends the span with what the dispatcher decided, and the handler's error (status ERROR) if it threw. */
export function endProcessSpan(
  process: ProcessSpan,
  outcome: ProcessOutcome | undefined,
  error?: unknown,
): void {
  const otel = api as Api;
  const { span } = process;
  if (outcome) {
    span.setAttribute(`${NS}.outcome`, outcome.kind === "dead" ? "dead_letter" : outcome.kind);
    if (outcome.kind === "retry") span.setAttribute(`${NS}.retry.delay_ms`, outcome.delayMs);
    if (outcome.kind === "dead") span.setAttribute(`${NS}.dead_letter.reason`, outcome.reason);
  }
  if (error !== undefined) {
    const exception =
      error instanceof Error
        ? error
        : { name: "Error", message: typeof error === "string" ? error : String(error) };
    span.recordException(exception);
    span.setAttribute("error.type", exception.name || "Error");
    span.setStatus({ code: otel.SpanStatusCode.ERROR, message: exception.message });
  }
  span.end();
}
