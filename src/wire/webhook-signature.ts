import { createHmac, timingSafeEqual } from "node:crypto";

const WHSEC_PREFIX = "whsec_";

/** The key bytes of a Standard Webhooks secret `whsec_<base64>`, or null when it is not one (24 to 64 bytes). */
export function signingKey(secret: string): Buffer | null {
  if (!secret.startsWith(WHSEC_PREFIX)) return null;
  const encoded = secret.slice(WHSEC_PREFIX.length);
  // Buffer.from(…, "base64") skips what is not base64: check the text first, so a typo cannot shorten the key.
  if (!/^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$/.test(encoded)) return null;
  const key = Buffer.from(encoded, "base64");
  return key.length >= 24 && key.length <= 64 ? key : null;
}

/** The raw HMAC-SHA256 of `"<id>.<timestamp>.<body>"` under one key. */
function digest(key: Buffer, id: string, timestamp: number | string, body: string | Buffer): Buffer {
  return createHmac("sha256", key).update(`${id}.${timestamp}.`).update(body).digest();
}

/**
 * Standard Webhooks `webhook-signature`: `v1,<base64 HMAC-SHA256 of "<id>.<timestamp>.<body>">` for each
 * key, space-separated (several while a secret is rotated: the receiver accepts any that matches).
 */
export function webhookSignature(
  keys: readonly Buffer[],
  id: string,
  timestamp: number,
  body: string,
): string {
  return keys.map((key) => `v1,${digest(key, id, timestamp, body).toString("base64")}`).join(" ");
}

/** Why a signed request is refused; null when it verifies. */
export type SignatureProblem =
  | "missing webhook-id, webhook-timestamp or webhook-signature"
  | "webhook-timestamp is not a number of seconds"
  | "webhook-timestamp is too old"
  | "webhook-timestamp is too far in the future"
  | "no signature matches";

/**
 * Checks a Standard Webhooks request: its timestamp within `toleranceSeconds` of `nowSeconds` either way
 * (a captured request replayed later is refused), and one of the `v1,` signatures of the header matching
 * one of `keys` (several while a secret is rotated). The timestamp is checked first, so a stale request
 * costs no HMAC. Signatures are compared in constant time, on their decoded bytes.
 */
export function verifyWebhookSignature(
  keys: readonly Buffer[],
  headers: { id?: string; timestamp?: string; signature?: string },
  body: string | Buffer,
  options: { toleranceSeconds: number; nowSeconds: number },
): SignatureProblem | null {
  const { id, timestamp, signature } = headers;
  if (!id || !timestamp || !signature) return "missing webhook-id, webhook-timestamp or webhook-signature";
  if (!/^\d{1,12}$/.test(timestamp)) return "webhook-timestamp is not a number of seconds";
  const sentAt = Number(timestamp);
  if (sentAt < options.nowSeconds - options.toleranceSeconds) return "webhook-timestamp is too old";
  if (sentAt > options.nowSeconds + options.toleranceSeconds)
    return "webhook-timestamp is too far in the future";
  const offered: Buffer[] = [];
  for (const part of signature.split(" ")) {
    const [version, value] = part.split(",", 2);
    if (version === "v1" && value !== undefined) offered.push(Buffer.from(value, "base64"));
  }
  let matched = false;
  for (const key of keys) {
    const expected = digest(key, id, timestamp, body);
    for (const candidate of offered) {
      // timingSafeEqual needs equal lengths; a length is no secret (every v1 signature is 32 bytes).
      if (candidate.length === expected.length && timingSafeEqual(candidate, expected)) matched = true;
    }
  }
  return matched ? null : "no signature matches";
}
