/**
 * The transaction-scoped advisory lock on one (queue, key), as SQL taking two text expressions. Producers
 * hold it until commit (so same-key rows commit in id order); a completion that removes a key's head tries
 * it, so it never promotes a successor while a producer of that key is still in flight; replay tries it
 * too (a plain-SQL producer locks its keys in its own row order, so waiting in any order could deadlock).
 * The key-head trigger's function and every function that removes or adds a key's rows
 * (migrations/functions/: mark_key_head, ack_keyed, ack_key_heads, dead_letter, cancel, fan_out,
 * route_unrouted) take the same lock: keep the spellings identical.
 */
export const KEY_LOCK = (queue: string, key: string): string =>
  `pg_advisory_xact_lock(hashtext(${queue}), hashtext(${key}))`;

/** The same lock, tried without waiting: true when taken (or already held by this transaction). */
export const TRY_KEY_LOCK = (queue: string, key: string): string =>
  `pg_try_advisory_xact_lock(hashtext(${queue}), hashtext(${key}))`;

/**
 * An ack's turn on a follow-up key, as SQL taking the turn's id (ACK_TURN_ID): an advisory lock in the
 * one-bigint space, apart from the key locks (two int4). Only the worker's acks with keyed follow-ups take
 * turns, waiting, in id order and before any other lock of their statement: two acks sharing keys then
 * queue instead of finding each other's key locks busy, and no one holding a key lock ever waits for a turn.
 */
export const ACK_TURN = (id: string): string => `pg_advisory_xact_lock(${id})`;

/** The ACK_TURN id of (queue, key): the key lock's two hashes as one bigint. */
export const ACK_TURN_ID = (queue: string, key: string): string =>
  `((hashtext(${queue})::bigint << 32) | (hashtext(${key})::bigint & 4294967295))`;

/**
 * Turns one ack takes at most: those of its lowest turn ids. Acks sharing many keys share their lowest
 * too (and so queue), and the locks an ack holds stay bounded whatever its keys.
 */
export const TURN_LIMIT = 64;
