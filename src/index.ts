export { MigrationError, OutboxConfigError, OutboxError, OutboxPayloadError } from "./contract/errors.js";
export type { FollowUp } from "./contract/follow-up.js";
export { followUp } from "./contract/follow-up.js";
export type {
  FailureAnnouncement,
  FailureEvent,
  Handler,
  HandlerResult,
  MessageContext,
  QueueConfig,
  TransactionalHandler,
  TransactionClient,
  TransactionContext,
} from "./contract/handler.js";
export { PermanentError, TransientError } from "./contract/handler-errors.js";
export type { InboxOptions } from "./contract/inbox.js";
export type { QueueDefinition } from "./contract/queue.js";
export type { RetryContext, RetryDecision, RetryStrategy } from "./contract/retry.js";
export type { TopicDefinition } from "./contract/topic.js";
export { TOPIC_HEADER, topicMatches } from "./contract/topic.js";
export { transactionKysely } from "./contract/transaction-kysely.js";
export type {
  DeadLetter,
  DeadLetterQuery,
  MessageId,
  PurgeOptions,
  PurgeResult,
  ReplayFilter,
  ReplayOptions,
  ReplayResult,
} from "./inspect/dead-letters.js";
export {
  getDeadLetter,
  listDeadLetters,
  purgeDeadLetters,
  replayDeadLetters,
} from "./inspect/dead-letters.js";
export type { MessageState, PeekedMessage, PeekOptions } from "./inspect/peek.js";
export { peekMessages } from "./inspect/peek.js";
export type { QueueStatus, WorkerLeases } from "./inspect/status.js";
export { queueStatus, workerLeases } from "./inspect/status.js";
export type {
  TopicStatus,
  TopicStatusOptions,
  TopicSubscribers,
  UnroutedEvents,
  UnroutedTopic,
} from "./inspect/subscriptions-status.js";
export { topicStatus } from "./inspect/subscriptions-status.js";
export type { TableHealth } from "./inspect/table-health.js";
export { describeTableHealth, tableHealth } from "./inspect/table-health.js";
export type { MigrateOptions, MigrateResult, MigrationState } from "./migrate/migrator.js";
export { migrate, migrationState, printMigrations } from "./migrate/migrator.js";
export { disableNotifyTrigger, enableNotifyTrigger } from "./migrate/notify-trigger.js";
export type { ListenerState } from "./notify/notifier.js";
export type {
  CancelResult,
  DedupedPublish,
  DedupePublishItem,
  DedupePublishOptions,
  PublishedEvent,
  Publisher,
  PublisherOptions,
  PublishItem,
  PublishOptions,
} from "./produce/publisher.js";
export {
  cancel,
  createPublisher,
  publish,
  publishMany,
  publishManyToTopic,
  publishToTopic,
} from "./produce/publisher.js";
export { defineQueue } from "./produce/queue.js";
export { defineTopic, subscriberQueue } from "./produce/topic.js";
export type { RelayConfig } from "./relay/config.js";
export { createRelay } from "./relay/create-relay.js";
export { constant, exponential, giveUpAfter, linear, none } from "./retry/strategies.js";
export type { Executor } from "./sql/executor.js";
export { DEFAULT_SCHEMA, outboxNames, validateSchemaName } from "./sql/names.js";
export type { Subscription, SubscriptionTarget } from "./subscribe/subscriptions.js";
export { listSubscriptions, subscribe, subscribersOf, unsubscribe } from "./subscribe/subscriptions.js";
export { redactConnectionString } from "./util/redact.js";
export type { LeasePhase, WorkerEventName, WorkerEvents } from "./worker/events.js";
export type { TransactionalQueueOptions, WorkerOptions } from "./worker/options.js";
export { handle, handleInTransaction } from "./worker/options.js";
export type { StopResult, Worker } from "./worker/worker.js";
export { createWorker } from "./worker/worker.js";
