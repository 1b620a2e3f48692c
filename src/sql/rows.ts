/** The columns every message row carries, in messages, in the unprocessed view and in dead_letters. */
export interface MessageColumns {
  /** The message id (a bigint, as a string). */
  id: string;
  queue: string;
  /** The payload, parsed from its jsonb. */
  payload: unknown;
  headers: Record<string, string>;
  /** The ordering key given at publish, if any. */
  key: string | null;
  created_at: Date;
  /** Not delivered before this time (publish delay or retry backoff). */
  available_at: Date;
  /** Times the row was leased (crash re-claims count). */
  deliveries_count: number;
  /** Handler attempts that ended. */
  attempts_count: number;
  /** Failures counted towards `maxAttempts` (transient ones excluded). */
  failures_count: number;
  first_attempt_at: Date | null;
  last_attempt_at: Date | null;
}
