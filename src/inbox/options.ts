import { z } from "zod";
import { OutboxConfigError } from "../contract/errors.js";

/** The part of a `pg` client the inbox uses: a `pg.PoolClient` is one. */
export interface InboxClient {
  /** Runs one statement. */
  query(text: string, values?: unknown[]): Promise<{ rowCount: number | null; rows: unknown[] }>;
  /** Gives the client back to its pool; with an error, the pool destroys it instead. */
  release(error?: Error | boolean): void;
}

/** The part of a `pg.Pool` the inbox uses: it takes one client per event, for one transaction. */
export interface InboxPool<C extends InboxClient = InboxClient> {
  /** A client of its own, for one event's transaction. */
  connect(): Promise<C>;
  /** Runs one statement on any client (install, expiry). */
  query(text: string, values?: unknown[]): Promise<{ rowCount: number | null; rows: unknown[] }>;
}

const DAY_MS = 86_400_000;

// Spliced into SQL as quoted identifiers: plain lower-case names only, so a name reads the same quoted or
// not, and nothing that could end the quote ever reaches the SQL text.
const identifier = z
  .string()
  .regex(/^[a-z_][a-z0-9_]*$/, 'must be a plain identifier: lower-case letters, digits and "_"')
  .refine(
    (name) => Buffer.byteLength(name) <= 50,
    "must be at most 50 bytes (derived index names must fit in 63)",
  )
  .refine((name) => !name.startsWith("pg_"), 'must not start with "pg_" (reserved by Postgres)');

export const inboxOptionsSchema = z.strictObject({
  pool: z.custom<InboxPool>(
    (value) =>
      typeof value === "object" &&
      value !== null &&
      typeof (value as InboxPool).connect === "function" &&
      typeof (value as InboxPool).query === "function",
    "must be a pg Pool (an object with connect() and query())",
  ),
  consumer: z
    .string()
    .min(1, "must name the consumer (the service or handler the records belong to)")
    .max(200, "must be at most 200 characters"),
  schema: identifier.default("public"),
  table: identifier.default("outbox_inbox"),
  retentionMs: z
    .number()
    .int()
    .min(60_000, "must be at least 60000 (one minute): records must outlive every redelivery")
    .default(7 * DAY_MS),
});

/** Options of {@link createInbox}, as a caller writes them. */
export interface InboxOptions<C extends InboxClient = InboxClient> {
  /** The receiving service's own database (a `pg.Pool`): records and effects commit together there. */
  pool: InboxPool<C>;
  /** Whose records these are: the service or handler (a table may hold several consumers' records). */
  consumer: string;
  /** The table's schema; default `public`. */
  schema?: string;
  /** The table; default `outbox_inbox`. */
  table?: string;
  /**
   * How long a record is kept, in ms (default 7 days, at least one minute): an event redelivered later
   * than this runs again. Keep it longer than any redelivery (relay retries, broker redelivery).
   */
  retentionMs?: number;
}

/**
 * Parses options with a zod schema; every problem is an {@link OutboxConfigError} naming its field (zod's
 * messages never echo the value, so a connection string in a wrong place cannot leak).
 */
export function parseOptions<S extends z.ZodType>(schema: S, input: unknown, field: string): z.output<S> {
  const parsed = schema.safeParse(input);
  if (parsed.success) return parsed.data;
  const problems = parsed.error.issues.map((i) => `${[field, ...i.path].join(".")}: ${i.message}`);
  const fields = [...new Set(parsed.error.issues.map((i) => [field, ...i.path].join(".")))].join(", ");
  throw new OutboxConfigError(
    fields,
    problems.join("; "),
    `invalid ${field} options: ${problems.join("; ")}`,
  );
}
