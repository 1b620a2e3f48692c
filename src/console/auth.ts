import { createHash, timingSafeEqual } from "node:crypto";
import type { IncomingMessage } from "node:http";

/** The console's tokens; either may be unset (reads open, or writes disabled). */
export interface ConsoleTokens {
  readToken?: string | undefined;
  writeToken?: string | undefined;
}

/** Why a request was refused: the status and a message that never quotes a token. */
export interface Refusal {
  status: 401 | 403;
  error: string;
  /** A token was given and did not fit: an attempt worth logging (a missing one is a page not signed in). */
  wrongToken?: boolean;
}

const digest = (text: string) => createHash("sha256").update(text, "utf8").digest();

/**
 * Equal in constant time: both sides are hashed first, so the comparison neither stops at the first
 * differing byte nor leaks the expected token's length through an early length check.
 */
export function tokenMatches(given: string | undefined, expected: string | undefined): boolean {
  if (given === undefined || expected === undefined) return false;
  return timingSafeEqual(digest(given), digest(expected));
}

/** The token of an `Authorization: Bearer <token>` header, or undefined. */
export function bearerToken(req: IncomingMessage): string | undefined {
  const header = req.headers.authorization;
  if (typeof header !== "string") return undefined;
  const match = /^Bearer\s+(\S+)\s*$/i.exec(header);
  return match?.[1];
}

/** Reads: open without a read token; with one, the read or the write token (a writer may look too). */
export function checkRead(req: IncomingMessage, tokens: ConsoleTokens): Refusal | undefined {
  if (tokens.readToken === undefined) return undefined;
  const given = bearerToken(req);
  if (given === undefined) return { status: 401, error: "this console needs a token to read" };
  if (tokenMatches(given, tokens.readToken) || tokenMatches(given, tokens.writeToken)) return undefined;
  return { status: 403, error: "wrong token", wrongToken: true };
}

/** Writes (replay, purge): only with the write token, and never when none is configured. */
export function checkWrite(req: IncomingMessage, tokens: ConsoleTokens): Refusal | undefined {
  if (tokens.writeToken === undefined) {
    return {
      status: 403,
      error:
        "writes are disabled: no write token is configured (console.writeToken, OUTBOX_CONSOLE_WRITE_TOKEN)",
    };
  }
  const given = bearerToken(req);
  if (given === undefined) return { status: 401, error: "replay and purge need the write token" };
  return tokenMatches(given, tokens.writeToken)
    ? undefined
    : { status: 403, error: "wrong token", wrongToken: true };
}
