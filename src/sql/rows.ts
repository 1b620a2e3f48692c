/** The columns every message row carries, in messages, in the unprocessed view and in dead_letters. */
export interface MessageColumns {
  id: string;
  queue: string;
  payload: unknown;
  headers: Record<string, string>;
  key: string | null;
  created_at: Date;
  available_at: Date;
  deliveries_count: number;
  attempts_count: number;
  failures_count: number;
  first_attempt_at: Date | null;
  last_attempt_at: Date | null;
}
