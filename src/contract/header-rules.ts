import { textProblem } from "./storable-text.js";

/**
 * What every relay's transport can carry as a header, checked at publish: a relay picked later must not
 * have to dead-letter the message for it. Names are RFC 9110 tokens (HTTP's header names, within what a
 * NATS header line allows) of at most 255 bytes (an AMQP table's field name); values hold no line break
 * (it would end a NATS or HTTP header line) and, like names, nothing Postgres cannot store.
 */
export const HEADER_NAME = /^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/;
const MAX_HEADER_NAME_BYTES = 255;
const LINE_BREAK = /[\r\n]/;

/** Why a header name cannot be carried by every transport, or undefined. */
export function headerNameProblem(name: string): string | undefined {
  if (!HEADER_NAME.test(name))
    return "a header name must be an HTTP token: ASCII letters, digits and ! # $ % & ' * + - . ^ _ ` | ~";
  // Tokens are ASCII: characters are bytes.
  if (name.length > MAX_HEADER_NAME_BYTES)
    return `a header name is at most ${MAX_HEADER_NAME_BYTES} bytes (AMQP), this one is ${name.length}`;
  return undefined;
}

/** Why a header value cannot be carried by every transport, or undefined. */
export function headerValueProblem(value: string): string | undefined {
  if (LINE_BREAK.test(value)) return "holds a line break (CR or LF), which would end a header line";
  return textProblem(value);
}
