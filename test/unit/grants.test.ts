import { describe, expect, it } from "vitest";
import { OutboxConfigError } from "../../src/contract/errors.js";
import { grantScript, grantStatements, validateRoleName } from "../../src/sql/grants.js";

describe("grantStatements", () => {
  it("revokes PUBLIC's EXECUTE, strips every named role before any grant, quotes every name", () => {
    const sql = grantStatements({
      schema: "outbox",
      producer: ["app"],
      worker: ["app", "w"],
      inspector: ["r"],
    });
    expect(sql[0]).toBe('REVOKE ALL ON ALL FUNCTIONS IN SCHEMA "outbox" FROM PUBLIC');
    const lastRevoke = sql.findLastIndex((s) => s.startsWith("REVOKE"));
    const firstGrant = sql.findIndex((s) => s.startsWith("GRANT"));
    // A role named for two sides keeps both: no revoke after its first grant.
    expect(lastRevoke).toBeLessThan(firstGrant);
    expect(sql.filter((s) => s === 'REVOKE ALL ON ALL TABLES IN SCHEMA "outbox" FROM "app"')).toHaveLength(1);
    for (const s of sql.filter((x) => x.startsWith("GRANT"))) expect(s).toMatch(/ TO "(app|w|r)"$/);
    expect(sql).toContain(
      'GRANT INSERT (queue, payload, headers, key, available_at) ON "outbox".messages TO "app"',
    );
    expect(sql).toContain('GRANT SELECT (id, queue, key) ON "outbox".messages TO "app"');
    expect(sql.join("\n")).not.toMatch(/TRUNCATE|CREATE|ALTER|PASSWORD|LOGIN|ALL PRIVILEGES/);
  });

  it("gives the inspector repair rights only when asked", () => {
    const plain = grantStatements({ schema: "s", inspector: ["r"] }).join("\n");
    const repair = grantStatements({ schema: "s", inspector: ["r"], inspectorCanRepair: true }).join("\n");
    expect(plain).not.toMatch(/INSERT|DELETE|UPDATE/);
    expect(repair).toMatch(/GRANT DELETE, UPDATE \(error\) ON "s".dead_letters TO "r"/);
  });

  it("lets the worker delete dead letters only with workerCanExpire", () => {
    expect(grantStatements({ schema: "s", worker: ["w"] }).join("\n")).not.toMatch(
      /DELETE ON "s".dead_letters/,
    );
    expect(grantStatements({ schema: "s", worker: ["w"], workerCanExpire: true })).toContain(
      'GRANT DELETE ON "s".dead_letters TO "w"',
    );
  });

  it("lets the worker insert messages (follow-ups) only with workerCanFollowUp, and only the producer's columns", () => {
    expect(grantStatements({ schema: "s", worker: ["w"] }).join("\n")).not.toMatch(
      /INSERT .*ON "s".messages/,
    );
    expect(grantStatements({ schema: "s", worker: ["w"], workerCanFollowUp: true })).toContain(
      'GRANT INSERT (queue, payload, headers, key, available_at) ON "s".messages TO "w"',
    );
  });

  it("creates missing roles NOLOGIN, never with a password, only with create", () => {
    expect(grantScript({ schema: "s", worker: ["w"] })).not.toContain("CREATE ROLE");
    const script = grantScript({ schema: "s", worker: ["w"], create: true });
    expect(script).toContain(`rolname = 'w'`);
    expect(script).toContain('CREATE ROLE "w" NOLOGIN;');
    expect(script).not.toMatch(/PASSWORD|[^O]LOGIN/);
  });

  it("refuses role names that are not plain, or are reserved, before writing any SQL", () => {
    for (const bad of [
      'x"; DROP ROLE postgres; --',
      "App",
      "a-b",
      "",
      "pg_monitor",
      "public",
      "current_user",
      "a".repeat(64),
    ]) {
      expect(() => validateRoleName(bad), bad).toThrow(OutboxConfigError);
      expect(() => grantStatements({ schema: "s", producer: [bad] }), bad).toThrow(OutboxConfigError);
    }
    expect(() => grantStatements({ schema: 'x"y', producer: ["p"] })).toThrow(OutboxConfigError);
    expect(validateRoleName("outbox_worker")).toBe("outbox_worker");
  });
});
