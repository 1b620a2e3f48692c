import { describe, expect, it } from "vitest";
import { textArray } from "../../src/sql/executor.js";
import { testDatabase } from "../support/database.js";

const db = testDatabase("tarr");

describe("textArray", () => {
  it("round-trips any text through Postgres, element for element", async () => {
    const values = [
      "plain",
      "",
      "NULL",
      "null",
      null,
      'a "quoted" key',
      "back\\slash\\",
      '\\"',
      "{braces},commas,",
      "  spaces  ",
      "tab\tnew\nline",
      "ünïcødé ✓ 🔑",
      "$1 ; DROP TABLE x; --",
      "'single'",
    ];
    const { rows } = await db.pool.query<{ a: (string | null)[] }>("SELECT $1::text[] AS a", [
      textArray(values),
    ]);
    expect(rows[0]?.a).toEqual(values);
  });

  it("writes an empty array as {}", async () => {
    expect(textArray([])).toBe("{}");
    const { rows } = await db.pool.query<{ n: number }>("SELECT cardinality($1::text[]) AS n", [
      textArray([]),
    ]);
    expect(rows[0]?.n).toBe(0);
  });
});
