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
