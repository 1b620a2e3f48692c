import { readFile } from "node:fs/promises";
import { describe, expect, it } from "vitest";
import { dumpSchema } from "../src/migrate/schema-dump.js";
import { SCHEMA_DUMP_COMMAND, SCHEMA_FILE } from "../src/migrate/schema-file.js";
import { testDatabase } from "./helpers/database.js";
import { lineDiff } from "./helpers/line-diff.js";

const db = testDatabase("drift");

describe("schema.sql", () => {
  it("is the schema the migrations and function files make", async () => {
    await db.migrate();
    const dumped = await dumpSchema(db.pool, db.schema);
    const checkedIn = await readFile(SCHEMA_FILE, "utf8");
    const diff = lineDiff(checkedIn, dumped);
    expect(
      diff,
      `schema.sql (-) differs from a freshly migrated schema (+): regenerate it with\n  ${SCHEMA_DUMP_COMMAND}\nand commit it with the migration or function file that changed it.\n${diff}\n`,
    ).toBe("");
  });
});
