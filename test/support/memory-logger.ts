import { Writable } from "node:stream";
import pino, { type Logger } from "pino";

/** One parsed pino line. */
export interface LogLine {
  level: number;
  msg: string;
  [field: string]: unknown;
}

/**
 * A pino logger at info whose lines a test can read back, parsed (`lines`) and as written (`raw`: what a
 * strict parser downstream would see; JSON.parse hides a key written twice).
 */
export function memoryLogger(): { logger: Logger; lines: LogLine[]; raw: string[] } {
  const lines: LogLine[] = [];
  const raw: string[] = [];
  const logger = pino(
    { level: "info" },
    new Writable({
      write(chunk, _encoding, done) {
        for (const line of String(chunk).split("\n")) {
          if (!line) continue;
          raw.push(line);
          lines.push(JSON.parse(line) as LogLine);
        }
        done();
      },
    }),
  );
  return { logger, lines, raw };
}
