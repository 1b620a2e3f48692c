/**
 * The transaction-scoped advisory lock on one (queue, key), as SQL taking two text expressions. Producers
 * hold it until commit (so same-key rows commit in id order); a completion that removes a key's head tries
 * it, so it never promotes a successor while a producer of that key is still in flight. The key-head
 * trigger (migrations 0003, 0007) and the ack_keyed (0005) and ack_key_heads (0006, 0009) functions take the
 * same lock: keep the spellings identical.
 */
export const KEY_LOCK = (queue: string, key: string): string =>
  `pg_advisory_xact_lock(hashtext(${queue}), hashtext(${key}))`;

/** The same lock, tried without waiting: true when taken (or already held by this transaction). */
export const TRY_KEY_LOCK = (queue: string, key: string): string =>
  `pg_try_advisory_xact_lock(hashtext(${queue}), hashtext(${key}))`;

/**
 * An ack's turn on the follow-up keys of one bucket (of TURN_BUCKETS, by the keys' hash), in the
 * namespace `scope` (text: one per outbox schema). Only the worker's acks with keyed follow-ups take
 * turns, waiting, in bucket order and before any other lock of their statement: two acks sharing keys then
 * queue instead of finding each other's key locks busy, and no one holding a key lock ever waits for a turn.
 */
export const ACK_TURN = (scope: string, bucket: string): string =>
  `pg_advisory_xact_lock(hashtext(${scope}), ${bucket})`;

/** Buckets of ACK_TURN: the locks an ack takes for its turns are bounded, whatever its keys. */
export const TURN_BUCKETS = 64;

/** The ACK_TURN bucket of (queue, key), as SQL. */
export const TURN_BUCKET = (queue: string, key: string): string =>
  `((hashtext(${queue}) # hashtext(${key})) & ${TURN_BUCKETS - 1})`;
