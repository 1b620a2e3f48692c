import type { IncomingMessage } from "node:http";
import { OutboxConfigError, OutboxError } from "../contract/errors.js";
import {
  getDeadLetter,
  purgeDeadLetters,
  type ReplayFilter,
  replayDeadLetters,
} from "../inspect/dead-letters.js";
import { deadLetterPage, getMessage, messagePage } from "../inspect/list-pages.js";
import { queueStatus, workerLeases } from "../inspect/status.js";
import { topicStatus } from "../inspect/subscriptions-status.js";
import type { Executor } from "../sql/executor.js";
import { parseDuration } from "../util/duration.js";
import type { History } from "./history.js";

/** A request the console refuses as malformed: its message goes back to the page (as text). */
export class BadRequest extends OutboxError {
  override name = "BadRequest";
}

/** Bodies are a few ids and filters: anything bigger is not from the page. */
const MAX_BODY_BYTES = 64 * 1024;

export async function readJsonBody(req: IncomingMessage): Promise<Record<string, unknown>> {
  // A JSON content type cannot be sent cross-site without a preflight: one more wall besides the token.
  const type = (req.headers["content-type"] ?? "").split(";")[0]?.trim().toLowerCase();
  if (type !== "application/json") throw new BadRequest("the body must be application/json");
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of req as AsyncIterable<Buffer>) {
    size += chunk.length;
    if (size > MAX_BODY_BYTES) throw new BadRequest(`the body is larger than ${MAX_BODY_BYTES} bytes`);
    chunks.push(chunk);
  }
  let value: unknown;
  try {
    value = JSON.parse(Buffer.concat(chunks).toString("utf8"));
  } catch {
    throw new BadRequest("the body is not valid JSON");
  }
  if (!value || typeof value !== "object" || Array.isArray(value)) {
    throw new BadRequest("the body must be a JSON object");
  }
  return value as Record<string, unknown>;
}

function optionalString(body: Record<string, unknown>, field: string): string | undefined {
  const value = body[field];
  if (value === undefined || value === null || value === "") return undefined;
  if (typeof value !== "string") throw new BadRequest(`${field} must be a string`);
  return value;
}

function optionalParam(params: URLSearchParams, name: string): string | undefined {
  const value = params.get(name);
  return value === null || value === "" ? undefined : value;
}

function optionalLimit(params: URLSearchParams): number | undefined {
  const raw = optionalParam(params, "limit");
  return raw === undefined ? undefined : Number(raw);
}

/** The console's JSON API: the same library functions as the CLI, nothing of its own in SQL. */
export function createApi(opts: { db: Executor; schema: string; history: History | undefined }) {
  const { db, schema } = opts;
  return {
    async status(writable: boolean) {
      const [queues, workers, topics] = await Promise.all([
        queueStatus(db, schema),
        workerLeases(db, schema),
        topicStatus(db, schema),
      ]);
      return {
        schema,
        writable,
        queues,
        workers,
        // Pattern → queues (null: this role may not read them), and the events no queue subscribed to.
        subscriptions: topics.subscriptions,
        unrouted: topics.unrouted,
        history: { intervalMs: opts.history?.intervalMs ?? null, samples: opts.history?.samples() ?? [] },
        now: new Date().toISOString(),
      };
    },
    workers: () => workerLeases(db, schema),
    // Lists are pages with payloads cut to a preview; the whole record is one more request (by id).
    peek: (params: URLSearchParams) =>
      messagePage(db, schema, {
        queue: optionalParam(params, "queue"),
        state: optionalParam(params, "state"),
        after: optionalParam(params, "after"),
        limit: optionalLimit(params),
      }),
    message: (id: string) => getMessage(db, schema, id),
    deadLetters: (params: URLSearchParams) =>
      deadLetterPage(db, schema, {
        queue: optionalParam(params, "queue"),
        reason: optionalParam(params, "reason"),
        before: optionalParam(params, "before"),
        limit: optionalLimit(params),
      }),
    deadLetter: (id: string) => getDeadLetter(db, schema, id),
    replay(body: Record<string, unknown>) {
      const ids = body.ids;
      if (ids !== undefined && (!Array.isArray(ids) || ids.some((id) => typeof id !== "string"))) {
        throw new BadRequest("ids must be a list of id strings");
      }
      const filter: ReplayFilter =
        body.all === true
          ? { all: true }
          : {
              ids: ids as string[] | undefined,
              queue: optionalString(body, "queue"),
              reason: optionalString(body, "reason"),
            };
      return replayDeadLetters(db, schema, filter, { dryRun: body.dryRun === true });
    },
    purge(body: Record<string, unknown>) {
      const olderThan = optionalString(body, "olderThan");
      if (olderThan === undefined) throw new BadRequest("olderThan is required (e.g. 7d, 12h, 30m)");
      let olderThanMs: number;
      try {
        olderThanMs = parseDuration(olderThan, "olderThan");
      } catch (error) {
        throw new BadRequest((error as Error).message);
      }
      return purgeDeadLetters(db, schema, {
        olderThanMs,
        queue: optionalString(body, "queue"),
        dryRun: body.dryRun === true,
      });
    },
  };
}

/** A caller's mistake (400, its message shown) as opposed to a failure (500, logged, not shown). */
export function isClientError(error: unknown): error is Error {
  return error instanceof BadRequest || error instanceof OutboxConfigError;
}
