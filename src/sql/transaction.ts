import { statement } from "./executor.js";

/**
 * Transaction control, as statements (named like the others, so they can run prepared): the lease store
 * opens its own transactions, and handlers' ones, on pooled connections.
 */
export const BEGIN = statement("begin", "BEGIN");
export const COMMIT = statement("commit", "COMMIT");
export const ROLLBACK = statement("rollback", "ROLLBACK");
// A handler's transaction is READ COMMITTED whatever the database's default: the keyed ack's promotion is a
// statement of its own so that its fresh snapshot sees every row a producer of the key committed; under
// REPEATABLE READ it would read the handler's first snapshot and could leave the key without a head.
export const BEGIN_HANDLER = statement("begin_handler", "BEGIN ISOLATION LEVEL READ COMMITTED");
// Around a try of an ack with keyed follow-ups inside a handler's transaction: a busy answer (or a lock wait
// given up, 55P03, which would abort the whole transaction) undoes the try, and with it the key locks and
// turns it took, so no producer waits on this transaction while it waits on that producer.
export const SAVEPOINT = statement("savepoint", "SAVEPOINT outbox_ack");
export const ROLLBACK_TO_SAVEPOINT = statement("rollback_savepoint", "ROLLBACK TO SAVEPOINT outbox_ack");
// Drops the generic plans this connection's named statements keep: the next executions plan for the tables
// as they are now (see the lease session's plan refresh). Session state only: no privilege needed.
export const DISCARD_PLANS = statement("discard_plans", "DISCARD PLANS");
