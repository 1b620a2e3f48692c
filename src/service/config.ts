import { readFile } from "node:fs/promises";
import path from "node:path";
import { z } from "zod";
import { ALLOWED_HOST_PATTERN, isLoopbackHost } from "../console/host-check.js";
import { OutboxError } from "../contract/errors.js";
import { validateQueueName } from "../contract/queue.js";
import { validateTopicPattern } from "../contract/topic.js";
import { relayConfigSchema } from "../relay/config.js";
import { DEFAULT_SCHEMA, validateSchemaName } from "../sql/names.js";
import { editDistance } from "../util/edit-distance.js";
import { parseJsonQuietly } from "../util/json-error.js";
import { scrubSecrets } from "../util/redact.js";
import { tuningIssues, workerTuningShape } from "../worker/options.js";
import { SERVICE_PATHS } from "./http-server.js";
import { importUserModule } from "./user-module.js";

/**
 * The service's configuration: one zod schema, fed by a file (JSON or a JS/TS module), then environment
 * variables, then command-line flags, each overriding the one before. The worker fields are the library's
 * own schema (workerTuningShape), so code, files and env agree on names, defaults and limits.
 */
export const LOG_LEVELS = ["fatal", "error", "warn", "info", "debug", "trace", "silent"] as const;

/**
 * What DATABASE_URL (and OUTBOX_LISTEN_URL) must look like; said in every error about them. The angle
 * brackets keep it whole in CLI output, whose scrubber masks the user info of anything shaped as a URL.
 */
export const CONNECTION_URL_FORM = "postgres://<user>:<password>@<host>:5432/<database>";

/**
 * A connection string shown in an error: the user info (everything between "://" and the last "@", so a
 * password with a stray "/" or "#" too) and sensitive query parameters masked. Never the raw value.
 */
function maskedConnectionString(raw: string): string {
  const start = raw.indexOf("://");
  const at = raw.lastIndexOf("@");
  const masked = start >= 0 && at > start ? `${raw.slice(0, start + 3)}***${raw.slice(at)}` : raw;
  return scrubSecrets(masked);
}

/**
 * Why a connection string is not one node-postgres would connect with as meant, or undefined. pg itself
 * takes almost anything (a libpq keyword string or an http:// URL resolve against a dummy base URL, and a
 * port "abc" fails only when connecting), so the service checks before it connects. Accepted as pg
 * documents them: postgres:// and postgresql:// URLs, socket: URLs and a leading "/" (a Unix socket).
 */
export function connectionUrlProblem(raw: string): string | undefined {
  const expected = `expected a URL like ${CONNECTION_URL_FORM}`;
  const value = raw.trim();
  if (value.startsWith("/")) return undefined;
  if (!/^[a-z][a-z0-9+.-]*:/i.test(value)) {
    // The keywords only, never a value: one of them may be the password.
    const keys = [...value.matchAll(/([A-Za-z_]+)\s*=/g)].map((m) => m[1]);
    return keys.length > 0
      ? `${expected}, got a libpq keyword/value string (${keys.join(", ")}); write it as a URL`
      : `${expected}, got ${JSON.stringify(maskedConnectionString(value))}`;
  }
  const scheme = value.slice(0, value.indexOf(":") + 1).toLowerCase();
  if (!["postgres:", "postgresql:", "socket:"].includes(scheme)) {
    return `${expected}, got a URL of scheme ${scheme} (${JSON.stringify(maskedConnectionString(value))})`;
  }
  // As pg parses it: spaces encoded, and a URL without a host ("user@/db") given one for the check.
  const encoded = /\s|%[^a-f0-9]|%[a-f0-9][^a-f0-9]/i.test(value)
    ? encodeURI(value).replace(/%25(\d\d)/g, "%$1")
    : value;
  for (const candidate of [encoded, encoded.replace("@/", "@host/")]) {
    if (URL.canParse(candidate)) return undefined;
  }
  return (
    `${expected}, got ${JSON.stringify(maskedConnectionString(value))}, which is not a valid URL ` +
    "(the port must be a number; percent-encode special characters of the user name and password)"
  );
}

/** The shortest dead-letter retention the service takes: one hour, in milliseconds. */
export const DEAD_LETTER_RETENTION_MIN_MS = 3_600_000;

const connectionUrl = z
  .string()
  .min(1)
  .superRefine((value, ctx) => {
    const problem = connectionUrlProblem(value);
    if (problem) ctx.addIssue({ code: "custom", message: problem });
  });

/** The `reason` of a name validator's error, as a zod issue on the value it was given. */
function nameCheck(validate: (name: string) => unknown) {
  return (value: string, ctx: z.RefinementCtx) => {
    try {
      validate(value);
    } catch (error) {
      ctx.addIssue({ code: "custom", message: (error as Error & { reason: string }).reason });
    }
  };
}

const workerSchema = z.strictObject(workerTuningShape).superRefine((worker, ctx) => {
  for (const issue of tuningIssues(worker)) {
    ctx.addIssue({ code: "custom", path: issue.path, message: issue.message });
  }
});

/** Where the HTTP server binds unless http.host says otherwise. */
export const DEFAULT_HTTP_HOST = "127.0.0.1";

/** A token is compared as text in an Authorization header: long enough not to be guessed. */
const consoleToken = z.string().min(16, { message: "must be at least 16 characters (use a random token)" });

const consoleSchema = z.strictObject({
  enabled: z.boolean().default(false),
  pathPrefix: z
    .string()
    .default("/console")
    .superRefine((value, ctx) => {
      // The prefix is written into the page's HTML and its links: a plain path only.
      if (!/^(\/[A-Za-z0-9._~-]+)+$/.test(value)) {
        ctx.addIssue({
          code: "custom",
          message: `must start with "/", have no trailing slash and only letters, digits, ".", "_", "~", "-" between slashes, got ${JSON.stringify(value)}`,
        });
      } else if (SERVICE_PATHS.some((p) => value === p || value.startsWith(`${p}/`))) {
        ctx.addIssue({ code: "custom", message: `must not clash with ${SERVICE_PATHS.join(", ")}` });
      }
    }),
  writeToken: consoleToken.optional(),
  readToken: consoleToken.optional(),
  // Names only: an IP literal, localhost and http.host are always answered (see host-check.ts).
  allowedHosts: z
    .array(
      z.string().superRefine((value, ctx) => {
        if (!ALLOWED_HOST_PATTERN.test(value)) {
          ctx.addIssue({
            code: "custom",
            message: `must be a host name without scheme or port, e.g. "ops.example.com", or ".example.com" for it and its subdomains, got ${JSON.stringify(value)}`,
          });
        }
      }),
    )
    .default([]),
});

// Every check sits on its own field, none on the whole object: zod skips an object's refinements once
// any of its fields is wrong, and a bad log level must not hide a bad schema name (all are listed at once).
export const serviceConfigSchema = z.strictObject({
  databaseUrl: connectionUrl.optional(),
  listenUrl: connectionUrl.optional(),
  workerId: z.string().min(1).max(200).optional(),
  schema: z.string().superRefine(nameCheck(validateSchemaName)).default(DEFAULT_SCHEMA),
  handlers: z.string().min(1).optional(),
  relays: z
    .record(z.string().superRefine(nameCheck((queue) => validateQueueName(queue))), relayConfigSchema)
    .default({}),
  // queue → topic names or patterns; each queue must be one this service serves (checked in startService,
  // once the handlers module is loaded).
  subscriptions: z
    .record(
      z.string().superRefine(nameCheck((queue) => validateQueueName(queue))),
      z.array(z.string().superRefine(nameCheck((pattern) => validateTopicPattern(pattern)))),
    )
    .default({}),
  migrate: z.boolean().default(false),
  startupWaitMs: z.number().int().min(0).max(3_600_000).default(30_000),
  dataDir: z.string().min(1).default(".outbox-data"),
  // Milliseconds like every other duration here; the floor catches a value meant as days or hours
  // (7 would delete every dead letter older than 7 ms), and a retention that short defeats replay anyway.
  deadLetterRetentionMs: z
    .number()
    .int()
    .min(DEAD_LETTER_RETENTION_MIN_MS, {
      message: `must be at least ${DEAD_LETTER_RETENTION_MIN_MS} (1 hour): the value is in milliseconds, e.g. 604800000 for 7 days`,
    })
    .optional(),
  // 0 is off. Under a second, a queue between two fetches of a busy worker could pass for unserved.
  unservedQueueWarnMs: z
    .number()
    .int()
    .min(0)
    .max(86_400_000)
    .refine((ms) => ms === 0 || ms >= 1000, { message: "must be 0 (off) or at least 1000 (1 s)" })
    .default(300_000),
  worker: workerSchema.default(() => workerSchema.parse({})),
  http: z
    .strictObject({
      port: z.number().int().min(0).max(65_535).optional(),
      // Loopback unless told otherwise: /metrics and the console must not face a network by accident.
      // A container sets OUTBOX_HTTP_HOST=0.0.0.0 (its network namespace is the boundary).
      host: z.string().min(1).default(DEFAULT_HTTP_HOST),
      gaugeIntervalMs: z.number().int().min(100).max(3_600_000).default(5000),
    })
    .default({ host: DEFAULT_HTTP_HOST, gaugeIntervalMs: 5000 }),
  console: consoleSchema.default(() => consoleSchema.parse({})),
  log: z
    .strictObject({ level: z.enum(LOG_LEVELS).default("info"), pretty: z.boolean().optional() })
    .default({ level: "info" }),
});

export type ServiceConfig = z.output<typeof serviceConfigSchema>;
export type ServiceConfigInput = z.input<typeof serviceConfigSchema>;

type FieldType = "string" | "integer" | "number" | "boolean" | "json" | "enum" | "list";

/** One settable leaf of the config: where it lives, its environment variable, and what it is for. */
export interface ConfigField {
  path: string;
  env: string;
  type: FieldType;
  description: string;
}

const TUNING_DESCRIPTIONS: Record<keyof typeof workerTuningShape, string> = {
  concurrency: "handlers running at once",
  batchSize:
    "most rows one fetch leases: it starts at max(concurrency, 10) and doubles while fetches come back full",
  maxHeldBytes:
    "most payload bytes fetched and held (queued and running), plus one row: a larger row is still delivered",
  leaseTtlMs: "lease length; a crashed worker's rows are retried after it",
  heartbeatMs: "lease renewal period (default a third of leaseTtlMs, at most half)",
  minPollIntervalMs:
    "poll interval while rows keep coming, and always when LISTEN gets no wake-ups (poll-only)",
  maxPollIntervalMs:
    "poll interval after empty fetches while LISTEN works (doubling from the minimum); without it, the minimum",
  listen: "wake on LISTEN/NOTIFY (polling always runs)",
  synchronousCommit:
    "wait for the WAL flush on the worker's own writes (off: a server crash can only redeliver)",
  preparedStatements:
    "named prepared statements, unless a transaction-mode pooler (PgBouncer) is found at start; false: never",
  leaseMode:
    "token (each row leased under a token, renewed) or transaction (a batch held by its transaction: less database work, for fast handlers)",
  queryTimeoutMs: "bound on each database round trip (default leaseTtlMs / 3, at most 10 s)",
  handlerTimeoutMs: "run time after which a handler is aborted and its attempt fails (timeout)",
  poolSize:
    "the worker's database connections (the service adds 2, 3 with deadLetterRetentionMs, and concurrency when a handler runs in its ack's transaction; LISTEN takes 1 more)",
  maxDeliveries:
    "deliveries ending without an outcome (crash, lost lease) before a row is dead-lettered as max_deliveries",
  maxAttempts: "failures (transient ones excluded) before retries_exhausted",
  completionBatchSize: "outcomes written per statement at most",
  completionWindowMs: "how long outcomes gather before a write",
  maxConsecutiveFailures:
    "failed fetches or writes in a row before the worker gives up (exit 1), and never sooner than their shortest backoffs add up to (116 s at the defaults)",
  loopBackoffBaseMs: "first backoff after a database failure",
  loopBackoffMaxMs: "longest backoff after database failures",
  stopTimeoutMs: "how long SIGTERM waits for running handlers",
  inboxRetentionMs:
    "how long inbox records are kept (a later redelivery runs its handler again); the worker deletes older ones",
  keyHeadRepairIntervalMs:
    "how often keys whose head was deleted outside the worker (by hand, by an older worker) get their next message as head",
  maxErrorLength: "longest error text kept in last_error and dead letters",
};

/** How an environment variable of a tuning field is read, from the field's own zod type (never a list to keep in step). */
function tuningFieldType(schema: z.ZodType): FieldType {
  let inner = schema as z.ZodType & { def: { type: string; innerType?: z.ZodType } };
  while (inner.def.innerType) inner = inner.def.innerType as typeof inner;
  if (inner instanceof z.ZodBoolean) return "boolean";
  if (inner instanceof z.ZodNumber) return inner.isInt ? "integer" : "number";
  if (inner instanceof z.ZodEnum) return "enum";
  throw new OutboxError(`no environment type for a ${inner.def.type} tuning field`);
}

const envName = (key: string) => `OUTBOX_${key.replace(/[A-Z]/g, (c) => `_${c}`).toUpperCase()}`;

export const configFields: ConfigField[] = [
  {
    path: "databaseUrl",
    env: "DATABASE_URL",
    type: "string",
    description: "Postgres connection string; unset: an embedded Postgres in dataDir",
  },
  {
    path: "workerId",
    env: "OUTBOX_WORKER_ID",
    type: "string",
    description: "this worker's name in acquired_by and logs (default the host name, e.g. the pod's)",
  },
  {
    path: "listenUrl",
    env: "OUTBOX_LISTEN_URL",
    type: "string",
    description: "LISTEN connection (default databaseUrl); behind a transaction pooler, the database itself",
  },
  { path: "schema", env: "OUTBOX_SCHEMA", type: "string", description: "outbox schema" },
  {
    path: "handlers",
    env: "OUTBOX_HANDLERS",
    type: "string",
    description: "module exporting queue → handler (or queue definitions)",
  },
  {
    path: "relays",
    env: "OUTBOX_RELAYS",
    type: "json",
    description: "queue → built-in relay (http, redis, nats, rabbitmq); JSON in the environment",
  },
  {
    path: "subscriptions",
    env: "OUTBOX_SUBSCRIPTIONS",
    type: "json",
    description:
      'queue → topics or patterns it subscribes to at start, e.g. `{"billing": ["order.*"]}`; served queues only; add-only',
  },
  { path: "migrate", env: "OUTBOX_MIGRATE", type: "boolean", description: "apply migrations at start" },
  {
    path: "startupWaitMs",
    env: "OUTBOX_STARTUP_WAIT_MS",
    type: "integer",
    description: "how long `run` waits at start for a database that is not up yet",
  },
  {
    path: "dataDir",
    env: "OUTBOX_DATA_DIR",
    type: "string",
    description: "embedded Postgres data folder (when databaseUrl is unset)",
  },
  {
    path: "deadLetterRetentionMs",
    env: "OUTBOX_DEAD_LETTER_RETENTION_MS",
    type: "integer",
    description:
      "delete dead letters older than this (at least 1 hour), a few hundred rows at a time every minute; unset: kept forever",
  },
  {
    path: "unservedQueueWarnMs",
    env: "OUTBOX_UNSERVED_QUEUE_WARN_MS",
    type: "integer",
    description:
      "warn once per queue whose oldest ready message waited this long with no lease on it (every gaugeIntervalMs); 0: off",
  },
  ...Object.entries(TUNING_DESCRIPTIONS).map(([key, description]) => ({
    path: `worker.${key}`,
    env: envName(key),
    type: tuningFieldType(workerTuningShape[key as keyof typeof workerTuningShape]),
    description,
  })),
  {
    path: "http.port",
    env: "OUTBOX_HTTP_PORT",
    type: "integer",
    description: "port for /healthz, /readyz, /relays, /metrics and the console; unset: no HTTP server",
  },
  {
    path: "http.host",
    env: "OUTBOX_HTTP_HOST",
    type: "string",
    description:
      "address the HTTP server binds; 0.0.0.0 to be reached from outside (the Docker image sets it)",
  },
  {
    path: "http.gaugeIntervalMs",
    env: "OUTBOX_GAUGE_INTERVAL_MS",
    type: "integer",
    description: "how often the backlog gauges are queried",
  },
  {
    path: "console.enabled",
    env: "OUTBOX_CONSOLE_ENABLED",
    type: "boolean",
    description: "serve the operator web console on the HTTP server (needs http.port)",
  },
  {
    path: "console.pathPrefix",
    env: "OUTBOX_CONSOLE_PATH_PREFIX",
    type: "string",
    description: "the console's path prefix",
  },
  {
    path: "console.writeToken",
    env: "OUTBOX_CONSOLE_WRITE_TOKEN",
    type: "string",
    description: "secret bearer token for replay and purge (and reads); unset: the console is read-only",
  },
  {
    path: "console.readToken",
    env: "OUTBOX_CONSOLE_READ_TOKEN",
    type: "string",
    description:
      "secret bearer token every console read needs; unset: reads are open, allowed only when http.host is loopback",
  },
  {
    path: "console.allowedHosts",
    env: "OUTBOX_CONSOLE_ALLOWED_HOSTS",
    type: "list",
    description:
      "names the console answers besides IPs, localhost and http.host; comma-separated; `.example.com` adds its subdomains",
  },
  { path: "log.level", env: "OUTBOX_LOG_LEVEL", type: "enum", description: LOG_LEVELS.join(", ") },
  {
    path: "log.pretty",
    env: "OUTBOX_LOG_PRETTY",
    type: "boolean",
    description: "readable lines instead of JSON (default: when stdout is a terminal)",
  },
];

/** Thrown for a config that cannot run; `problems` name each field (and its env variable) with a hint. */
export class ConfigError extends OutboxError {
  override name = "ConfigError";
  constructor(readonly problems: string[]) {
    super(`invalid config:\n${problems.map((p) => `  - ${p}`).join("\n")}`);
  }
}

function parseEnvValue(field: ConfigField, raw: string): { value?: unknown; problem?: string } {
  const where = `${field.path} (${field.env})`;
  switch (field.type) {
    case "integer":
      return /^-?\d+$/.test(raw.trim())
        ? { value: Number(raw) }
        : { problem: `${where}: expected a whole number, got ${JSON.stringify(raw)}` };
    case "number":
      return raw.trim() !== "" && Number.isFinite(Number(raw))
        ? { value: Number(raw) }
        : { problem: `${where}: expected a number, got ${JSON.stringify(raw)}` };
    case "boolean": {
      const v = raw.trim().toLowerCase();
      if (["true", "1", "yes", "on"].includes(v)) return { value: true };
      if (["false", "0", "no", "off"].includes(v)) return { value: false };
      return { problem: `${where}: expected true or false, got ${JSON.stringify(raw)}` };
    }
    case "list":
      return {
        value: raw
          .split(",")
          .map((item) => item.trim())
          .filter((item) => item !== ""),
      };
    case "json":
      try {
        return { value: parseJsonQuietly(raw) };
      } catch (error) {
        // Says where, never what: the value may hold a password or a token.
        return { problem: `${where}: ${(error as Error).message}` };
      }
    default:
      return { value: raw };
  }
}

function setPath(target: Record<string, unknown>, dotted: string, value: unknown): void {
  const keys = dotted.split(".");
  let node = target;
  for (const key of keys.slice(0, -1)) {
    if (typeof node[key] !== "object" || node[key] === null) node[key] = {};
    node = node[key] as Record<string, unknown>;
  }
  node[keys[keys.length - 1] as string] = value;
}

function merge(base: Record<string, unknown>, over: Record<string, unknown>): Record<string, unknown> {
  const out: Record<string, unknown> = { ...base };
  for (const [key, value] of Object.entries(over)) {
    const prev = out[key];
    out[key] =
      value &&
      typeof value === "object" &&
      !Array.isArray(value) &&
      prev &&
      typeof prev === "object" &&
      key !== "relays" &&
      key !== "subscriptions"
        ? merge(prev as Record<string, unknown>, value as Record<string, unknown>)
        : value;
  }
  return out;
}

async function readConfigFile(file: string): Promise<Record<string, unknown>> {
  const full = path.resolve(file);
  let loaded: unknown;
  try {
    if (full.endsWith(".json")) {
      loaded = parseJsonQuietly(await readFile(full, "utf8"));
    } else {
      const mod = (await importUserModule(full)) as { default?: unknown };
      loaded = mod.default ?? mod;
      if (typeof loaded === "function") loaded = await (loaded as () => unknown)();
    }
  } catch (error) {
    throw new ConfigError([`config file ${file}: ${(error as Error).message}`]);
  }
  if (!loaded || typeof loaded !== "object" || Array.isArray(loaded)) {
    throw new ConfigError([`config file ${file}: must hold an object`]);
  }
  return loaded as Record<string, unknown>;
}

/** A field as it is written in a config: `relays.hook.subscribe[0]`. */
function fieldName(issuePath: readonly PropertyKey[]): string {
  return issuePath
    .map((p, i) => (typeof p === "number" ? `[${p}]` : `${i === 0 ? "" : "."}${String(p)}`))
    .join("");
}

function fieldLabel(issuePath: PropertyKey[]): string {
  const dotted = fieldName(issuePath);
  const field = configFields.find(
    (f) => dotted === f.path || dotted.startsWith(`${f.path}.`) || dotted.startsWith(`${f.path}[`),
  );
  return field ? `${dotted} (${field.env})` : dotted || "(config)";
}

/** A typo is the commonest config mistake: name the field we think was meant. */
function unknownField(dotted: string): string {
  const best = configFields
    .map((f) => ({ path: f.path, env: f.env, d: editDistance(dotted.toLowerCase(), f.path.toLowerCase()) }))
    .sort((x, y) => x.d - y.d)[0];
  const hint = best && best.d <= 3 ? ` (did you mean ${best.path}, ${best.env}?)` : "";
  return `${dotted}: unknown field${hint}`;
}

/**
 * OUTBOX_ variables that are read but are not config fields, so not refused as unknown. Keep this list
 * short and say who reads each one; a field's own variable comes from configFields, never from here.
 */
export const NON_FIELD_ENV_VARIABLES: readonly string[] = [
  // The config file itself: read by `outbox-worker run` (src/cli/run-command.ts) as --config's default.
  "OUTBOX_CONFIG",
  // Not here, though they start with OUTBOX_ in the source: the error code OUTBOX_LOCAL_QUEUE_ONTAKE and
  // the test stream names OUTBOX_RELAY_TEST_* / OUTBOX_BYTES_TEST_* are no variables; tests, bench and
  // compose set only field variables. A new non-field variable goes here, with who reads it.
];

/** A typo in a variable name would otherwise be ignored without a word: refuse it, naming the likely one. */
function unknownVariables(env: NodeJS.ProcessEnv): string[] {
  const known = new Set([...configFields.map((f) => f.env), ...NON_FIELD_ENV_VARIABLES]);
  const problems: string[] = [];
  for (const [name, value] of Object.entries(env)) {
    // Set but empty counts as unset, for unknown variables as for known ones.
    if (!name.startsWith("OUTBOX_") || known.has(name) || value === undefined || value === "") continue;
    const best = configFields
      .map((f) => ({ field: f, d: editDistance(name, f.env) }))
      .sort((x, y) => x.d - y.d)[0];
    const hint = best && best.d <= 3 ? ` (did you mean ${best.field.env} (${best.field.path})?)` : "";
    problems.push(`${name}: unknown environment variable${hint}`);
  }
  return problems.sort();
}

/** Checks between fields, run once every field is valid on its own. */
export function crossFieldProblems(config: ServiceConfig): string[] {
  const problems: string[] = [];
  if (config.console.enabled && config.http.port === undefined) {
    problems.push(
      "console.enabled (OUTBOX_CONSOLE_ENABLED): the console is served by the HTTP server: set http.port (OUTBOX_HTTP_PORT) too",
    );
  }
  if (config.console.enabled && config.console.readToken === undefined && !isLoopbackHost(config.http.host)) {
    problems.push(
      `console.readToken (OUTBOX_CONSOLE_READ_TOKEN): required when the console is on and http.host (OUTBOX_HTTP_HOST) is ${JSON.stringify(config.http.host)}, not a loopback address: without it anyone who reaches the port reads every payload and dead letter`,
    );
  }
  for (const [queue, relay] of Object.entries(config.relays)) {
    // A relay whose failure events went to its own queue would relay, fail and announce them for ever.
    const target = relay.announceFailures;
    if (target && "queue" in target && target.queue === queue)
      problems.push(
        `relays.${queue}.announceFailures.queue: must not be the relay's own queue: its failures would announce themselves`,
      );
  }
  return problems;
}

/**
 * File, then environment, then flags. Every problem is collected and reported at once, before anything
 * connects, each with its field and environment variable; an OUTBOX_ variable that is no field is one.
 */
export async function loadServiceConfig(options: {
  file?: string;
  env?: NodeJS.ProcessEnv;
  overrides?: Record<string, unknown>;
}): Promise<ServiceConfig> {
  const env = options.env ?? process.env;
  const fromFile = options.file ? await readConfigFile(options.file) : {};
  const fromEnv: Record<string, unknown> = {};
  const problems: string[] = unknownVariables(env);
  for (const field of configFields) {
    const raw = env[field.env];
    if (raw === undefined || raw === "") continue;
    const { value, problem } = parseEnvValue(field, raw);
    if (problem) problems.push(problem);
    else setPath(fromEnv, field.path, value);
  }
  const fromFlags: Record<string, unknown> = {};
  for (const [dotted, value] of Object.entries(options.overrides ?? {})) {
    if (value !== undefined) setPath(fromFlags, dotted, value);
  }
  const merged = merge(merge(fromFile, fromEnv), fromFlags);
  const parsed = serviceConfigSchema.safeParse(merged);
  if (!parsed.success) {
    for (const issue of parsed.error.issues) {
      if (issue.code === "unrecognized_keys") {
        for (const key of issue.keys) problems.push(unknownField([...issue.path, key].map(String).join(".")));
      } else if (issue.code === "invalid_key") {
        // A record key's own check (a relay's queue name): its message, not zod's "Invalid key in record".
        problems.push(`${fieldLabel(issue.path)}: ${issue.issues.map((i) => i.message).join("; ")}`);
      } else {
        problems.push(`${fieldLabel(issue.path)}: ${issue.message}`);
      }
    }
  }
  if (parsed.success) problems.push(...crossFieldProblems(parsed.data));
  if (problems.length > 0 || !parsed.success) throw new ConfigError(problems);
  return parsed.data;
}
