/**
 * Where JSON text stops being valid, as a line and column, without quoting any of it. V8's JSON.parse
 * messages quote a snippet of the input ("Unexpected token 'c', ..."servers": canary..." is not valid
 * JSON"), and a config value can hold a password or a token: an error about it must never echo it.
 */
export interface JsonSyntaxProblem {
  /** 0-based offset into the text. */
  offset: number;
  /** 1-based. */
  line: number;
  /** 1-based, in UTF-16 code units. */
  column: number;
  /** What is wrong there, in words that quote nothing of the input. */
  problem: string;
}

class Stop {
  constructor(
    readonly offset: number,
    readonly problem: string,
  ) {}
}

const NUMBER = /-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?/y;
const ESCAPES = new Set(['"', "\\", "/", "b", "f", "n", "r", "t"]);

/** The first syntax error of `text` as RFC 8259 JSON, or undefined when it is valid. */
export function findJsonSyntaxError(text: string): JsonSyntaxProblem | undefined {
  let i = 0;
  const ws = () => {
    while (i < text.length && " \t\n\r".includes(text[i] as string)) i++;
  };
  const end = (what: string) => new Stop(text.length, `unexpected end of input ${what}`);

  const string = () => {
    const start = i++;
    for (;;) {
      if (i >= text.length) throw new Stop(start, "unterminated string");
      const c = text.charCodeAt(i);
      if (c === 0x22) {
        i++;
        return;
      }
      if (c < 0x20) throw new Stop(i, "control character in a string");
      if (c === 0x5c) {
        const next = text[i + 1];
        if (next === undefined) throw new Stop(start, "unterminated string");
        if (next === "u") {
          if (!/^[0-9a-fA-F]{4}$/.test(text.slice(i + 2, i + 6))) throw new Stop(i, "bad \\u escape");
          i += 6;
        } else if (ESCAPES.has(next)) i += 2;
        else throw new Stop(i, "bad escape in a string");
      } else i++;
    }
  };

  const value = (depth: number): void => {
    // JSON.parse nests deeper than we may recurse; such text is reported without a position.
    if (depth > 5000) throw new RangeError("too deep");
    ws();
    if (i >= text.length) throw end("where a value should start");
    const c = text[i];
    if (c === "{") {
      i++;
      ws();
      if (text[i] === "}") {
        i++;
        return;
      }
      for (;;) {
        ws();
        if (i >= text.length) throw end("in an object");
        if (text[i] !== '"') throw new Stop(i, "expected a double-quoted property name");
        string();
        ws();
        if (i >= text.length) throw end("in an object");
        if (text[i] !== ":") throw new Stop(i, "expected ':' after a property name");
        i++;
        value(depth + 1);
        ws();
        if (i >= text.length) throw end("in an object");
        if (text[i] === "}") {
          i++;
          return;
        }
        if (text[i] !== ",") throw new Stop(i, "expected ',' or '}' after a property value");
        i++;
      }
    }
    if (c === "[") {
      i++;
      ws();
      if (text[i] === "]") {
        i++;
        return;
      }
      for (;;) {
        value(depth + 1);
        ws();
        if (i >= text.length) throw end("in an array");
        if (text[i] === "]") {
          i++;
          return;
        }
        if (text[i] !== ",") throw new Stop(i, "expected ',' or ']' after an array element");
        i++;
      }
    }
    if (c === '"') {
      string();
      return;
    }
    for (const word of ["true", "false", "null"]) {
      if (text.startsWith(word, i)) {
        i += word.length;
        return;
      }
    }
    NUMBER.lastIndex = i;
    if (NUMBER.test(text)) {
      i = NUMBER.lastIndex;
      return;
    }
    throw new Stop(i, "unexpected character where a value should start");
  };

  try {
    value(0);
    ws();
    if (i < text.length) throw new Stop(i, "unexpected text after the JSON value");
    return undefined;
  } catch (error) {
    if (!(error instanceof Stop)) return undefined;
    const before = text.slice(0, error.offset);
    const line = before.split("\n").length;
    const column = error.offset - (before.lastIndexOf("\n") + 1) + 1;
    return { offset: error.offset, line, column, problem: error.problem };
  }
}

/**
 * JSON.parse, but a syntax error says only where and what ("not valid JSON: unexpected character where a
 * value should start at line 1, column 27"), never the text it found there.
 */
export function parseJsonQuietly(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    const found = findJsonSyntaxError(text);
    throw new SyntaxError(
      found
        ? `not valid JSON: ${found.problem} at line ${found.line}, column ${found.column}`
        : "not valid JSON",
    );
  }
}
