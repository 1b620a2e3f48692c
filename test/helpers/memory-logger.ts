import { Writable } from "node:stream";
import pino, { type Logger } from "pino";

/** One parsed pino line. */
export interface LogLine {
  level: number;
  msg: string;
  [field: string]: unknown;
}

/** A pino logger at info whose lines a test can read back, parsed. */
export function memoryLogger(): { logger: Logger; lines: LogLine[] } {
  const lines: LogLine[] = [];
  const logger = pino(
    { level: "info" },
    new Writable({
      write(chunk, _encoding, done) {
        for (const line of String(chunk).split("\n")) if (line) lines.push(JSON.parse(line) as LogLine);
        done();
      },
    }),
  );
  return { logger, lines };
}
