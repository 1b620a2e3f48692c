/** A property name a reader can take as written after a dot; anything else goes in brackets, JSON-quoted. */
const IDENTIFIER = /^[A-Za-z_$][A-Za-z0-9_$]*$/;

/**
 * The path of a field inside `root` (may be empty), as code would write it: `payload.items[2].name`,
 * `headers["x-a\r\nb"]`. Quoting escapes control characters and lone surrogates, so the path is printable.
 */
export function fieldPath(root: string, segments: readonly PropertyKey[]): string {
  let path = root;
  for (const segment of segments) {
    if (typeof segment === "number") path += `[${segment}]`;
    else if (typeof segment === "symbol") path += `[${segment.toString()}]`;
    else if (!IDENTIFIER.test(segment)) path += `[${JSON.stringify(segment)}]`;
    else path += path === "" ? segment : `.${segment}`;
  }
  return path;
}
