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

/** A payload refused at publish time; nothing was written. */
export class OutboxPayloadError extends OutboxError {
  override name = "OutboxPayloadError";
  constructor(
    readonly queue: string,
    readonly reason: string,
  ) {
    super(`cannot publish to queue "${queue}": ${reason}`);
  }
}

/** The database and the migration files disagree; nothing was applied. */
export class MigrationError extends OutboxError {
  override name = "MigrationError";
}
