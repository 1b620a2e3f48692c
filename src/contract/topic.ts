import type { z } from "zod";
import { OutboxConfigError } from "./errors.js";

/**
 * A topic and the shape of its events. Publishing to it writes one message per queue subscribed to it
 * (the database's fan_out function), each validated against this schema at publish.
 */
export interface TopicDefinition<Input = unknown, Output = Input> {
  /** Dot-separated segments of letters, digits and `_ : / -`: `order.placed`. At most 200 bytes. */
  readonly topic: string;
  /** The zod schema of its events; undefined for any JSON value. Subscribers may reuse it for their queue. */
  readonly schema: z.ZodType<Output, Input> | undefined;
}

/** The header that carries, on each subscriber's copy, the topic it was published to. Reserved. */
export const TOPIC_HEADER = "outbox-topic";

export const MAX_TOPIC_BYTES = 200;
// The same rules the database checks (migrations/functions/fan_out.sql, topic_matcher.sql): keep them identical.
const SEGMENT = "[A-Za-z0-9_:/-]+";
const TOPIC_NAME = new RegExp(`^${SEGMENT}(\\.${SEGMENT})*$`);
const TOPIC_PATTERN = new RegExp(`^([*#]|${SEGMENT})(\\.([*#]|${SEGMENT}))*$`);

function checkLength(value: string, field: string): void {
  if (Buffer.byteLength(value) > MAX_TOPIC_BYTES)
    throw new OutboxConfigError(field, `"${value.slice(0, 40)}…" is longer than ${MAX_TOPIC_BYTES} bytes`);
}

/** Returns `name` if it can name a topic (no wildcard), else throws an OutboxConfigError naming `field`. */
export function validateTopicName(name: unknown, field = "topic"): string {
  if (typeof name !== "string" || name.length === 0)
    throw new OutboxConfigError(field, "must be a non-empty string");
  checkLength(name, field);
  if (!TOPIC_NAME.test(name)) {
    const hint = /[*#]/.test(name)
      ? " (* and # belong in a subscription's pattern, never in the topic an event is published to)"
      : "";
    throw new OutboxConfigError(
      field,
      `${JSON.stringify(name)} is not a topic name: dot-separated segments of letters, digits and _ : / -${hint}`,
    );
  }
  return name;
}

/**
 * Returns `pattern` if a subscription may use it, else throws. A pattern is a topic name whose segments may
 * also be `*` (exactly one segment) or `#` (zero or more): `order.*`, `order.#`, `*.failed`, `#`.
 */
export function validateTopicPattern(pattern: unknown, field = "topic"): string {
  if (typeof pattern !== "string" || pattern.length === 0)
    throw new OutboxConfigError(field, "must be a non-empty string");
  checkLength(pattern, field);
  if (!TOPIC_PATTERN.test(pattern)) {
    throw new OutboxConfigError(
      field,
      `${JSON.stringify(pattern)} is not a topic pattern: dot-separated segments of letters, digits and _ : / -, or * (one segment) or # (any number of segments)`,
    );
  }
  return pattern;
}

/**
 * Whether a subscription to `pattern` receives events published to `topic` (the database's rule, in TS).
 * Its work grows with the pattern's segments times the topic's, whatever the number of `#` in the pattern.
 */
export function topicMatches(pattern: string, topic: string): boolean {
  return matchSegments(pattern.split("."), topic.split("."));
}

/**
 * The matcher over segments: `*` is one non-empty segment, `#` any number of them, anything else itself.
 * One pass per pattern segment over the set of topic prefixes matched so far, so at most
 * (pattern segments + 1) × (topic segments + 1) steps: a backtracking matcher (a regular expression with
 * `(\.[^.]+)*` per `#`) is exponential in the number of `#`, and this runs on the event loop. `onStep`
 * counts the steps (tests).
 */
export function matchSegments(pattern: string[], topic: string[], onStep?: () => void): boolean {
  const n = topic.length;
  // reach[j]: the pattern's segments so far match the topic's first j segments.
  let reach: boolean[] = Array.from({ length: n + 1 }, (_, j) => j === 0);
  for (const segment of pattern) {
    const next: boolean[] = new Array(n + 1).fill(false);
    // `#` extends any reached prefix by a run of non-empty segments.
    let run = false;
    for (let j = 0; j <= n; j++) {
      onStep?.();
      const prev = topic[j - 1];
      if (segment === "#") {
        run = (run && prev !== undefined && prev !== "") || (reach[j] ?? false);
        next[j] = run;
      } else if (j > 0 && reach[j - 1]) {
        next[j] = segment === "*" ? prev !== "" : prev === segment;
      }
    }
    reach = next;
  }
  return reach[n] ?? false;
}
