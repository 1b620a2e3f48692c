import net from "node:net";
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import {
  classifyError,
  errorMessage,
  PermanentError,
  TransientError,
} from "../../src/contract/handler-errors.js";

const NETWORK_CODES = [
  "ECONNREFUSED",
  "ECONNRESET",
  "ETIMEDOUT",
  "EPIPE",
  "ENOTFOUND",
  "EAI_AGAIN",
  "EHOSTUNREACH",
  "ENETUNREACH",
  "ECONNABORTED",
  "UND_ERR_CONNECT_TIMEOUT",
  "UND_ERR_SOCKET",
  "UND_ERR_HEADERS_TIMEOUT",
  "UND_ERR_BODY_TIMEOUT",
];

function withCode(code: string, message = "x"): Error {
  return Object.assign(new Error(message), { code });
}

const wellFormed = (s: string) =>
  !/[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/.test(s);

/** A port on which nothing listens: bound, then released. */
async function closedPort(): Promise<number> {
  const server = net.createServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as net.AddressInfo;
  await new Promise((resolve) => server.close(resolve));
  return port;
}

/** An object whose every property read and conversion throws. */
const hostile = new Proxy(
  {},
  {
    get() {
      throw new Error("no reading");
    },
    has() {
      throw new Error("no has");
    },
    getPrototypeOf() {
      throw new Error("no prototype");
    },
    ownKeys() {
      throw new Error("no keys");
    },
  },
);

describe("error classes", () => {
  it("set name, message and cause, and are Errors", () => {
    const cause = new Error("root");
    const p = new PermanentError("bad payload", { cause });
    const t = new TransientError("try later");
    expect(p).toBeInstanceOf(Error);
    expect(p.name).toBe("PermanentError");
    expect(p.message).toBe("bad payload");
    expect(p.cause).toBe(cause);
    expect(t.name).toBe("TransientError");
    expect(String(t)).toBe("TransientError: try later");
    expect(new PermanentError().message).toBe("");
  });

  it("subclasses keep their classification", () => {
    class Invalid extends PermanentError {}
    class Busy extends TransientError {
      override name = "Busy";
    }
    expect(classifyError(new Invalid("no"))).toBe("permanent");
    expect(classifyError(new Busy("later"))).toBe("transient");
  });
});

describe("classifyError", () => {
  it("classifies our classes", () => {
    expect(classifyError(new PermanentError("x"))).toBe("permanent");
    expect(classifyError(new TransientError("x"))).toBe("transient");
  });

  it("honours the duck-typed markers (another copy of the library, a relay's own error)", () => {
    expect(classifyError(Object.assign(new Error("x"), { permanent: true }))).toBe("permanent");
    expect(classifyError(Object.assign(new Error("x"), { transient: true }))).toBe("transient");
    expect(classifyError({ transient: true })).toBe("transient");
    // Only a literal true counts.
    expect(classifyError(Object.assign(new Error("x"), { transient: "yes", permanent: 1 }))).toBe(
      "unclassified",
    );
  });

  it("lets a permanent marker win over a transient one or a network code", () => {
    expect(classifyError({ transient: true, permanent: true })).toBe("permanent");
    expect(classifyError(Object.assign(new PermanentError("x"), { code: "ECONNRESET" }))).toBe("permanent");
  });

  it.each(NETWORK_CODES)("treats code %s as transient", (code) => {
    expect(classifyError(withCode(code))).toBe("transient");
  });

  it("leaves other codes and plain errors unclassified", () => {
    expect(classifyError(withCode("ENOENT"))).toBe("unclassified");
    expect(classifyError(withCode("econnrefused"))).toBe("unclassified");
    expect(classifyError(new Error("ECONNREFUSED"))).toBe("unclassified");
    expect(classifyError(new TypeError("x is not a function"))).toBe("unclassified");
    expect(classifyError(new RangeError("x"))).toBe("unclassified");
  });

  it("treats a TimeoutError as transient", async () => {
    const signal = AbortSignal.timeout(1);
    await new Promise((resolve) => signal.addEventListener("abort", resolve));
    expect((signal.reason as Error).name).toBe("TimeoutError");
    expect(classifyError(signal.reason)).toBe("transient");
    expect(classifyError(Object.assign(new Error("t"), { name: "TimeoutError" }))).toBe("transient");
  });

  it("treats a real fetch failure to a closed port as transient", async () => {
    const port = await closedPort();
    const error = await fetch(`http://127.0.0.1:${port}/`, { signal: AbortSignal.timeout(5000) }).then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(error).toBeInstanceOf(TypeError);
    expect(classifyError(error)).toBe("transient");
  });

  it("walks a fetch TypeError's cause chain a few levels, but not forever", () => {
    const deep = (levels: number) => {
      let e: unknown = withCode("ECONNRESET");
      for (let i = 0; i < levels; i++) e = new Error(`wrap ${i}`, { cause: e });
      return new TypeError("fetch failed", { cause: e });
    };
    expect(classifyError(deep(0))).toBe("transient");
    expect(classifyError(deep(3))).toBe("transient");
    expect(classifyError(deep(50))).toBe("unclassified");
    expect(classifyError(new TypeError("fetch failed", { cause: withCode("ENOENT") }))).toBe("unclassified");
  });

  it("does not walk the cause of a non-TypeError", () => {
    expect(classifyError(new Error("wrapped", { cause: withCode("ECONNRESET") }))).toBe("unclassified");
  });

  it("survives a cyclic cause chain", () => {
    const a = new TypeError("fetch failed");
    const b = new Error("b", { cause: a });
    Object.assign(a, { cause: b });
    expect(classifyError(a)).toBe("unclassified");
  });

  it("never throws, whatever was thrown", () => {
    const getterBomb = Object.defineProperty(new Error("x"), "code", {
      get() {
        throw new Error("getter");
      },
    });
    for (const weird of [
      null,
      undefined,
      0,
      "ECONNREFUSED",
      Symbol("s"),
      10n,
      hostile,
      getterBomb,
      () => {},
    ]) {
      expect(classifyError(weird)).toBe("unclassified");
    }
    fc.assert(
      fc.property(fc.anything(), (value) => {
        expect(classifyError(value)).toBe("unclassified");
      }),
    );
  });
});

describe("errorMessage", () => {
  it("formats Name: message", () => {
    expect(errorMessage(new TypeError("nope"))).toBe("TypeError: nope");
    expect(errorMessage(new PermanentError("bad"))).toBe("PermanentError: bad");
    expect(errorMessage(new Error(""))).toBe("Error");
    expect(errorMessage({ message: "plain object" })).toBe("Error: plain object");
  });

  it("appends the cause chain", () => {
    const e = new Error("outer", { cause: new TypeError("middle", { cause: "root string" }) });
    expect(errorMessage(e)).toBe("Error: outer\ncaused by: TypeError: middle\ncaused by: root string");
  });

  it("stops at a cyclic or very deep cause chain", () => {
    const a = new Error("a");
    const b = new Error("b", { cause: a });
    Object.assign(a, { cause: b });
    expect(errorMessage(a)).toBe("Error: a\ncaused by: Error: b");
    let deep: unknown = new Error("root");
    for (let i = 0; i < 100; i++) deep = new Error(`level ${i}`, { cause: deep });
    expect(errorMessage(deep).split("\n").length).toBe(6);
  });

  it("explains the empty-message errors Node produces for dual-stack connect failures", async () => {
    const port = await closedPort();
    const agg = new AggregateError(
      [
        withCode("ECONNREFUSED", `connect ECONNREFUSED ::1:${port}`),
        withCode("ECONNREFUSED", "connect ECONNREFUSED v4"),
      ],
      "",
    );
    Object.assign(agg, { code: "ECONNREFUSED" });
    expect(errorMessage(agg)).toBe(
      `AggregateError: Error: connect ECONNREFUSED ::1:${port}; Error: connect ECONNREFUSED v4`,
    );
    expect(errorMessage(withCode("ECONNRESET", ""))).toBe("Error: ECONNRESET");
    const real = await fetch(`http://127.0.0.1:${port}/`, { signal: AbortSignal.timeout(5000) }).catch(
      (e: unknown) => e,
    );
    expect(errorMessage(real)).toMatch(/^TypeError: fetch failed\ncaused by: Error: connect ECONNREFUSED/);
  });

  it("describes non-errors", () => {
    expect(errorMessage(null)).toBe("null");
    expect(errorMessage(undefined)).toBe("undefined");
    expect(errorMessage("just a string")).toBe("just a string");
    expect(errorMessage(42)).toBe("42");
    expect(errorMessage(10n)).toBe("10");
    expect(errorMessage(Symbol("sym"))).toBe("Symbol(sym)");
    expect(errorMessage({ status: 503 })).toBe('{"status":503}');
    expect(errorMessage(Object.create(null))).toBe("[object Object]");
    expect(errorMessage({ big: 1n })).toBe("[object Object]");
  });

  it("never throws, even for hostile throwables", () => {
    const getters = Object.defineProperties(new Error("hidden"), {
      name: {
        get() {
          throw new Error("name getter");
        },
      },
      message: {
        get() {
          throw new Error("message getter");
        },
      },
      cause: {
        get() {
          throw new Error("cause getter");
        },
      },
    });
    expect(errorMessage(getters)).toBe("Error");
    expect(typeof errorMessage(hostile)).toBe("string");
    const badToString = {
      toString() {
        throw new Error("no");
      },
      toJSON() {
        throw new Error("no");
      },
    };
    expect(errorMessage(badToString)).toBe("[object Object]");
    const { proxy, revoke } = Proxy.revocable({}, {});
    revoke();
    expect(typeof errorMessage(proxy)).toBe("string");
  });

  it("truncates to maxLength with an ellipsis, without splitting a surrogate pair", () => {
    const long = errorMessage(new Error("x".repeat(5000)));
    expect(long.length).toBe(2000);
    expect(long.endsWith("x…")).toBe(true);
    expect(errorMessage(new Error("abcdef"), 10)).toBe("Error: ab…");
    expect(errorMessage(new Error("abc"), 10)).toBe("Error: abc");
    expect(errorMessage(new Error("😀😀😀😀"), 10)).toBe("Error: 😀…");
    // The cut would fall between the two halves of the emoji.
    expect(errorMessage(new Error("😀😀😀😀"), 9)).toBe("Error: …");
  });

  it("replaces NUL characters, which Postgres text cannot store", () => {
    expect(errorMessage(new Error("a\u0000b"))).toBe("Error: a\\0b");
  });

  it("property: never throws, returns a string of at most maxLength without NUL", () => {
    fc.assert(
      fc.property(
        fc.oneof(
          fc.anything(),
          fc.string({ unit: "binary", maxLength: 300 }).map((m) => new Error(m)),
          fc
            .tuple(fc.string({ unit: "binary" }), fc.anything())
            .map(([m, cause]) => new TypeError(m, { cause })),
        ),
        fc.integer({ min: 1, max: 300 }),
        (value, maxLength) => {
          const text = errorMessage(value, maxLength);
          expect(typeof text).toBe("string");
          expect(text.length).toBeLessThanOrEqual(maxLength);
          expect(text.includes("\u0000")).toBe(false);
          // Truncation must not create a lone surrogate that the full text did not have.
          if (wellFormed(errorMessage(value, 1e6))) expect(wellFormed(text)).toBe(true);
        },
      ),
    );
  });
});
