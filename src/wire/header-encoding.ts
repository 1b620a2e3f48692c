/**
 * The header value encoding of the CloudEvents HTTP and NATS bindings (§3.1.3.2 in both): space, double
 * quote, percent and every character outside printable ASCII as upper-case %XX of its UTF-8 bytes. A key may
 * hold any Unicode; a header line holds ASCII (and NATS trims values). The relays encode, the inbox decodes.
 */
export function encodeHeaderValue(value: string): string {
  // The u flag walks code points: a surrogate pair is one character, encoded as its four UTF-8 bytes.
  return value.replace(/[^\x21\x23\x24\x26-\x7e]/gu, (char) => {
    let encoded = "";
    for (const byte of Buffer.from(char, "utf8"))
      encoded += `%${byte.toString(16).toUpperCase().padStart(2, "0")}`;
    return encoded;
  });
}

/**
 * The inverse of {@link encodeHeaderValue}: every %XX run read as UTF-8 bytes. Throws a TypeError for a `%`
 * not followed by two hex digits or bytes that are not UTF-8 (the sender did not encode the value).
 */
export function decodeHeaderValue(value: string): string {
  if (!value.includes("%")) return value;
  // decodeURIComponent is exact for this encoding (no `+` for space) and throws URIError on bad input.
  try {
    return decodeURIComponent(value);
  } catch {
    throw new TypeError("malformed percent-encoding");
  }
}

/** Printable ASCII, spaces inside only: a header line carries it exactly (fetch trims outer whitespace). */
const HTTP_CARRIES = /^[\x21-\x7e](?:[\x20-\x7e]*[\x21-\x7e])?$/;

/**
 * A plain (not CloudEvents) header's value on HTTP: as it is where a header line carries it and holds no
 * `%` a receiver could read as an escape; else percent-encoded like a `ce-` value, so a decoding receiver
 * (the inbox) restores every value exactly. No standard asks plain headers to be encoded.
 */
export function plainHeaderValue(value: string): string {
  return HTTP_CARRIES.test(value) && !value.includes("%") ? value : encodeHeaderValue(value);
}

/** A W3C trace context header on HTTP: as it is where a header line carries it (its format is ASCII). */
export function traceHeaderValue(value: string): string {
  return HTTP_CARRIES.test(value) ? value : encodeHeaderValue(value);
}
