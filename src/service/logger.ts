import { Writable } from "node:stream";
import pino, { type DestinationStream, type Logger } from "pino";
import { scrubJsonLines } from "../util/redact.js";

// Paths that could hold a secret if someone logs a config or an error object carrying one.
const REDACT = [
  "databaseUrl",
  "config.databaseUrl",
  "password",
  "*.password",
  "signingSecret",
  "*.signingSecret",
  "relays.*.signingSecret",
  // Replaced by signingSecret, but an old config that still holds one may be logged while it is refused.
  "hmacSecret",
  "*.hmacSecret",
  "relays.*.hmacSecret",
  "relays.*.url",
];

const LEVEL_NAMES: Record<number, string> = {
  10: "TRACE",
  20: "DEBUG",
  30: "INFO",
  40: "WARN",
  50: "ERROR",
  60: "FATAL",
};
const SKIP = new Set(["level", "time", "msg", "pid", "hostname", "name"]);

/** One readable line per JSON record: time, level, message, then the other fields as key=value. */
export function prettyLine(json: string): string {
  let record: Record<string, unknown>;
  try {
    record = JSON.parse(json);
  } catch {
    return json;
  }
  const time = new Date(Number(record.time)).toISOString().slice(11, 23);
  const level = (LEVEL_NAMES[Number(record.level)] ?? String(record.level)).padEnd(5);
  const fields = Object.entries(record)
    .filter(([k]) => !SKIP.has(k))
    .map(([k, v]) => `${k}=${typeof v === "string" ? v : JSON.stringify(v)}`)
    .join(" ");
  return `${time} ${level} ${String(record.msg ?? "")}${fields ? `  ${fields}` : ""}`;
}

function prettyStream(out: NodeJS.WritableStream): Writable {
  let pending = "";
  return new Writable({
    write(chunk, _encoding, done) {
      pending += chunk.toString();
      const lines = pending.split("\n");
      pending = lines.pop() ?? "";
      for (const line of lines) if (line) out.write(`${prettyLine(line)}\n`);
      done();
    },
  });
}

/**
 * Every serialized line passes through scrubJsonLines: the paths above only cover fields we know, while
 * an error's message or stack, a child binding or a driver's text can quote a URL with a token in it.
 */
function scrubbing(out: { write(chunk: string): unknown }): DestinationStream {
  return { write: (chunk: string) => void out.write(scrubJsonLines(chunk)) };
}

/** pino JSON logs, or readable lines when asked for (default: when stdout is a terminal). */
export function createLogger(options: {
  level: string;
  pretty?: boolean;
  stream?: NodeJS.WritableStream;
}): Logger {
  const out = options.stream ?? process.stdout;
  const pretty = options.pretty ?? (out === process.stdout && process.stdout.isTTY === true);
  const base = { level: options.level, name: "outbox-worker", redact: { paths: REDACT, censor: "***" } };
  if (pretty) return pino(base, scrubbing(prettyStream(out)));
  // Synchronous to stdout, so the last lines before an exit are never lost.
  return pino(base, scrubbing(out === process.stdout ? pino.destination({ dest: 1, sync: true }) : out));
}
