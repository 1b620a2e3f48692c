import { TransientError } from "../contract/handler-errors.js";

/**
 * Settles like `work`, unless `timeoutMs` passes or `signal` aborts first: then rejects with a
 * TransientError. The work itself is not cancelled, so the broker may still accept it later; every relay
 * is at least once, and a retry of the same id is what the consumer's dedupe is for.
 */
export function withDeadline<T>(
  work: Promise<T>,
  options: { signal?: AbortSignal; timeoutMs: number; what: string },
): Promise<T> {
  const { signal, timeoutMs, what } = options;
  if (signal?.aborted) {
    work.catch(() => {});
    return Promise.reject(new TransientError(`${what}: aborted`, { cause: signal.reason }));
  }
  return new Promise<T>((resolve, reject) => {
    const finish = () => {
      clearTimeout(timer);
      signal?.removeEventListener("abort", onAbort);
    };
    const onAbort = () => {
      finish();
      reject(new TransientError(`${what}: aborted`, { cause: signal?.reason }));
    };
    const timer = setTimeout(() => {
      finish();
      reject(new TransientError(`${what}: no answer within ${timeoutMs} ms`));
    }, timeoutMs);
    signal?.addEventListener("abort", onAbort, { once: true });
    work.then(
      (value) => {
        finish();
        resolve(value);
      },
      (error: unknown) => {
        finish();
        reject(error);
      },
    );
  });
}
