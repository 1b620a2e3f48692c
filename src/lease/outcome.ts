import type { PreparedFollowUp } from "../contract/follow-up.js";
import type { InboxRecord } from "../contract/inbox.js";
import type { HeldRow } from "./held.js";

/**
 * How a delivery ended, decided by the dispatcher and written by the completer. Each kind is also the
 * lease store's write for it (`AckWrite`, `RetryWrite`, `DeadWrite`), so no outcome is copied to be written.
 */
export type Outcome =
  | {
      kind: "ack";
      held: HeldRow;
      durationMs: number;
      /** Inserted by the ack's own statement, under its token; absent (most acks) when there are none. */
      followUps?: readonly PreparedFollowUp[];
      /**
       * The queue's inbox record: after a handler that ran, written (and committed) before the ack; with
       * `deduped`, the record found, and the handler did not run (nothing is written but the ack).
       */
      inbox?: InboxRecord;
      deduped?: true;
    }
  | {
      kind: "retry";
      held: HeldRow;
      delayMs: number;
      error: string;
      failed: 0 | 1;
      transient: boolean;
      timedOut: boolean;
    }
  | { kind: "dead"; held: HeldRow; reason: string; error: string | null; attempted: 0 | 1; failed: 0 | 1 };

export type OutcomeOf<K extends Outcome["kind"]> = Extract<Outcome, { kind: K }>;
