/**
 * A JSON reader as strict as the strictest log pipelines: it refuses what JSON.parse lets through by
 * keeping the last value, an object that names a key twice (RFC 8259 says names SHOULD be unique; jq
 * --seq, Go's json/v2, many SIEM parsers reject or mangle such lines). Returns the duplicated keys by path,
 * an empty list when there are none; throws on text that is not JSON at all.
 */
export function duplicateKeys(text: string): string[] {
  let at = 0;
  const found: string[] = [];

  const fail = (what: string): never => {
    throw new Error(`not JSON at ${at}: ${what} in ${JSON.stringify(text.slice(0, 200))}`);
  };
  const space = () => {
    while (at < text.length && " \t\n\r".includes(text[at] as string)) at++;
  };
  const expect = (char: string) => {
    if (text[at] !== char) fail(`expected ${char}`);
    at++;
  };

  function string(): string {
    const start = at;
    expect('"');
    while (at < text.length && text[at] !== '"') at += text[at] === "\\" ? 2 : 1;
    expect('"');
    return JSON.parse(text.slice(start, at)) as string;
  }

  function value(path: string): void {
    space();
    const char = text[at];
    if (char === "{") {
      at++;
      const keys = new Set<string>();
      space();
      if (text[at] === "}") {
        at++;
        return;
      }
      for (;;) {
        space();
        const key = string();
        if (keys.has(key)) found.push(`${path}.${key}`);
        keys.add(key);
        space();
        expect(":");
        value(`${path}.${key}`);
        space();
        if (text[at] !== ",") break;
        at++;
      }
      expect("}");
      return;
    }
    if (char === "[") {
      at++;
      space();
      if (text[at] === "]") {
        at++;
        return;
      }
      for (let i = 0; ; i++) {
        value(`${path}[${i}]`);
        space();
        if (text[at] !== ",") break;
        at++;
      }
      expect("]");
      return;
    }
    if (char === '"') {
      string();
      return;
    }
    const literal = /^(?:true|false|null|-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?)/.exec(text.slice(at));
    if (!literal) fail("expected a value");
    at += (literal as RegExpExecArray)[0].length;
  }

  value("$");
  space();
  if (at !== text.length) fail("trailing text");
  return found;
}
