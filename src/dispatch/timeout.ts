import { OutboxError } from "../contract/errors.js";

/**
 * The reason a handler's signal aborts, and the error its attempt fails with, when it runs past its
 * timeout. It counts towards `maxAttempts` like any unclassified failure, so a message whose handler always
 * hangs ends in dead letters (reason `timeout`) instead of holding a lease forever.
 */
export class HandlerTimeoutError extends OutboxError {
  override name = "HandlerTimeoutError";
  readonly timeout = true;

  constructor(readonly timeoutMs: number) {
    super(`handler did not finish within ${timeoutMs} ms (timeout)`);
  }
}

export function isHandlerTimeout(error: unknown): error is HandlerTimeoutError {
  return error instanceof HandlerTimeoutError;
}
