/**
 * `pg-outbox-worker/testing`: run a queue's handler without a database and get back what the worker would
 * write (acked with follow-ups, retried with its delay, dead-lettered with its reason, lost); or run one
 * topic event through each subscriber's handler and get each subscriber's outcome.
 *
 * @packageDocumentation
 */
export type { Clock, ManualClock } from "./clock.js";
export { createManualClock, systemClock } from "./clock.js";
export type { TestMessage } from "./context.js";
export type { HandlerRun, HarnessOptions, TestRunOptions } from "./harness.js";
export { testHandler } from "./harness.js";
export type {
  AckedOutcome,
  DeadOutcome,
  LostOutcome,
  RetriedOutcome,
  TestFollowUp,
  TestOutcome,
} from "./outcome.js";
export type { SubscriberHandlers, TopicEventOptions, TopicOutcomes, TopicRun } from "./topic.js";
export { testTopic } from "./topic.js";
