/** Base class of every error this package throws on purpose, so callers can tell ours from the driver's. */
export class OutboxError extends Error {
  override name = "OutboxError";
}

/** A schema, queue or option value that cannot be used. Thrown before any SQL runs. */
export class OutboxConfigError extends OutboxError {
  override name = "OutboxConfigError";
  constructor(
    readonly field: string,
    readonly reason: string,
    message = `${field}: ${reason}`,
  ) {
    super(message);
  }
}

/**
 * A message refused at publish time (by `publish`, `publishMany` or a follow-up), before any statement was
 * sent: nothing was written, and the caller's transaction is still usable.
 */
export class OutboxPayloadError extends OutboxError {
  override name = "OutboxPayloadError";
  /** The refused field: `payload.items[2].name`, `key`, `headers["x-a"]`, `delayMs`… */
  readonly field: string | undefined;
  /** The refused item's index in a `publishMany` batch. */
  readonly index: number | undefined;
  constructor(
    readonly queue: string,
    readonly reason: string,
    where: { field?: string; index?: number } = {},
  ) {
    const item = where.index === undefined ? "" : `item ${where.index}: `;
    super(`cannot publish to queue "${queue}": ${item}${reason}`);
    this.field = where.field;
    this.index = where.index;
  }
}

/** The database and the migration files disagree; nothing was applied. */
export class MigrationError extends OutboxError {
  override name = "MigrationError";
}
