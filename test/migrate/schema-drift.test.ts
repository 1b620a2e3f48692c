import { randomBytes } from "node:crypto";
import { readFile } from "node:fs/promises";
import { describe, expect, it } from "vitest";
import { migrate } from "../../src/migrate/migrator.js";
import { dumpSchema } from "../../src/migrate/schema-dump.js";
import { SCHEMA_DUMP_COMMAND, SCHEMA_FILE } from "../../src/migrate/schema-file.js";
import { grantStatements } from "../../src/sql/grants.js";
import { testDatabase } from "../support/database.js";
import { lineDiff } from "../support/line-diff.js";

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

  it("shows the rights roles hold, by table, column and function, under the schema's dump name", async () => {
    const schema = db.freshSchema("rights");
    const role = `drift_${randomBytes(4).toString("hex")}`;
    await db.pool.query(`CREATE ROLE "${role}" NOLOGIN`);
    try {
      await migrate({ connection: db.pool, schema });
      for (const statement of grantStatements({ schema, worker: [role] })) await db.pool.query(statement);
      const dumped = await dumpSchema(db.pool, schema);
      expect(dumped).toContain(`GRANT USAGE ON SCHEMA outbox TO ${role};`);
      expect(dumped).toContain(`GRANT DELETE, SELECT ON TABLE outbox.messages TO ${role};`);
      expect(dumped).toContain(`GRANT UPDATE (head) ON TABLE outbox.messages TO ${role};`);
      expect(dumped).toContain(
        `GRANT EXECUTE ON FUNCTION outbox.ack_key_heads(bigint[],uuid[],text[],text[],integer,uuid,double precision,text,boolean) TO ${role};`,
      );
      // `grant` takes PUBLIC's EXECUTE from every function: each one's rights are set, PUBLIC is not among them.
      expect(dumped).toContain("REVOKE ALL ON FUNCTION outbox.fan_out(text,jsonb,boolean) FROM PUBLIC;");
      expect(dumped).not.toContain(schema);
    } finally {
      await db.pool.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
      await db.pool.query(`DROP OWNED BY "${role}"`);
      await db.pool.query(`DROP ROLE "${role}"`);
    }
  });
});
