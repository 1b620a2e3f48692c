import pg from "pg";
import { migrate } from "../../src/migrate/migrator.js";
import { outboxNames } from "../../src/sql/names.js";
import { DATABASE_URL } from "../lib.js";

/** `schema` dropped and migrated afresh, with a connected client → the client and its messages table. */
export async function freshSchema(schema: string): Promise<{ client: pg.Client; messages: string }> {
  const client = new pg.Client({ connectionString: DATABASE_URL });
  await client.connect();
  await client.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
  await migrate({ connection: DATABASE_URL, schema });
  return { client, messages: outboxNames(schema).messages };
}
