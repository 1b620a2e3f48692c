/**
 * `pg-outbox-worker/inbox`: for the services that receive the relays' messages. Effects in the receiving
 * service's own Postgres happen once per event (per source and id), for the inbox's retention: the record
 * of an event and the handler's writes commit in one transaction. Light at load: no worker, no logger, no
 * broker client (broker messages are typed by shape).
 * @module inbox
 */

export { OutboxConfigError } from "../contract/errors.js";
export { decodeHeaderValue, encodeHeaderValue } from "../wire/header-encoding.js";
export { type SignatureProblem, verifyWebhookSignature } from "../wire/webhook-signature.js";
export { type InboxEvent, MalformedEventError } from "./event.js";
export { decodeHttpEvent, type RequestHeaders } from "./http-event.js";
export {
  createInbox,
  type Inbox,
  type InboxExpiry,
  type InboxExpiryTimer,
  type InboxKey,
  type InboxResult,
} from "./inbox.js";
export { handleWithKysely } from "./kysely.js";
export type { InboxClient, InboxOptions, InboxPool } from "./options.js";
export {
  type AmqpMessageLike,
  decodeAmqpMessage,
  decodeNatsMessage,
  decodeRedisEntry,
  handleAmqpMessage,
  handleNatsMessage,
  handleRedisEntry,
  type InboxHandler,
  type NatsHeadersLike,
  type NatsMessageLike,
  type RedisEntryFields,
} from "./transports.js";
export { createWebhookHandler, type WebhookHandler, type WebhookOptions } from "./webhook.js";
