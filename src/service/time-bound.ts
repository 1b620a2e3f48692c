import { OutboxError } from "../contract/errors.js";

/**
 * Settles like `promise`, or rejects with "`what` timed out after `ms` ms" first. The promise itself runs
 * on; its later rejection is swallowed so it never becomes an unhandled one.
 */
export function timeBound<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new OutboxError(`${what} timed out after ${ms} ms`)), ms);
  });
  promise.catch(() => {});
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}
