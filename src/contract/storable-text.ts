/** A surrogate half with no partner: not Unicode, so not UTF-8 either. */
const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;

/**
 * Why Postgres cannot store this string as it is, or undefined. text refuses a NUL (22021) and jsonb its
 * escape (22P05); a lone surrogate fails jsonb (22P02) and in text silently becomes U+FFFD.
 */
export function textProblem(text: string): string | undefined {
  if (text.includes("\0")) return "holds a NUL character (U+0000), which Postgres cannot store";
  if (LONE_SURROGATE.test(text))
    return "holds a lone surrogate (half of a UTF-16 pair, not valid Unicode), which Postgres cannot store";
  return undefined;
}
