import type { ServerResponse } from "node:http";

/**
 * Headers on every console response. The CSP allows only the console's own script, style and API, so
 * even a payload that slipped into the DOM as markup could not run or load anything.
 */
export const SECURITY_HEADERS: Readonly<Record<string, string>> = {
  "content-security-policy":
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
  "x-content-type-options": "nosniff",
  "referrer-policy": "no-referrer",
  "x-frame-options": "DENY",
  "cache-control": "no-store",
};

export function sendText(
  res: ServerResponse,
  status: number,
  contentType: string,
  body: string,
  extra: Record<string, string> = {},
): void {
  res.writeHead(status, {
    ...SECURITY_HEADERS,
    "content-type": contentType,
    "content-length": String(Buffer.byteLength(body)),
    ...extra,
  });
  res.end(body);
}

/** JSON, with bigint ids and dates as strings (ids are bigint in Postgres: text is their lossless form). */
export function sendJson(
  res: ServerResponse,
  status: number,
  value: unknown,
  extra: Record<string, string> = {},
): void {
  const body = JSON.stringify(value, (_key, v) => (typeof v === "bigint" ? v.toString() : v));
  sendText(res, status, "application/json; charset=utf-8", body, extra);
}
