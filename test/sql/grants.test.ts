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
      'GRANT INSERT (queue, payload, headers, key, available_at, topic, dedupe_key) ON "outbox".messages TO "app"',
    );
    expect(sql).toContain('GRANT SELECT (id, queue, key, dedupe_key) ON "outbox".messages TO "app"');
    // Cancel by dedupe key, as the schema's owner: no DELETE for a producer.
    expect(sql).toContain('GRANT EXECUTE ON FUNCTION "outbox".cancel(text, text) TO "app"');
    expect(sql).toContain('GRANT EXECUTE ON FUNCTION "outbox".fan_out(text, jsonb, boolean) TO "app"');
    expect(sql.join("\n")).not.toMatch(/TRUNCATE|CREATE|ALTER|PASSWORD|LOGIN|ALL PRIVILEGES/);
  });

  it("gives the inspector repair rights only when asked", () => {
    const plain = grantStatements({ schema: "s", inspector: ["r"] }).join("\n");
    const repair = grantStatements({ schema: "s", inspector: ["r"], inspectorCanRepair: true }).join("\n");
    expect(plain).not.toMatch(/INSERT|DELETE|UPDATE|route_unrouted|fan_out/);
    expect(plain).toContain('GRANT SELECT ON "s".subscriptions TO "r"');
    expect(repair).toContain('GRANT DELETE ON "s".dead_letters TO "r"');
    expect(repair).toContain('GRANT UPDATE (error) ON "s".dead_letters TO "r"');
    expect(repair).toContain('GRANT EXECUTE ON FUNCTION "s".route_unrouted(bigint[]) TO "r"');
    expect(repair).not.toMatch(/fan_out|topic_matcher/);
  });

  it("gives nobody a right to change subscriptions but a worker with workerCanSubscribe, and that adds only", () => {
    const everyone = grantStatements({
      schema: "s",
      producer: ["p"],
      worker: ["w"],
      inspector: ["r"],
      inspectorCanRepair: true,
      workerCanExpire: true,
      workerCanFollowUp: true,
    });
    const onSubscriptions = everyone.filter((x) => x.startsWith("GRANT") && x.includes('"s".subscriptions'));
    expect(onSubscriptions).toEqual(['GRANT SELECT ON "s".subscriptions TO "r"']);
    expect(everyone.join("\n")).not.toContain("topic_matcher");
    const subscriber = grantStatements({ schema: "s", worker: ["w"], workerCanSubscribe: true });
    expect(subscriber).toContain('GRANT INSERT (pattern, queue) ON "s".subscriptions TO "w"');
    expect(subscriber).toContain('GRANT SELECT (pattern, queue) ON "s".subscriptions TO "w"');
    expect(subscriber).toContain('GRANT EXECUTE ON FUNCTION "s".topic_matcher(text) TO "w"');
    expect(subscriber.join("\n")).not.toMatch(/(UPDATE|DELETE)[^\n]*subscriptions|fan_out/);
  });

  it("lets the worker expire dead letters only with workerCanExpire, and only through expire_dead_letters", () => {
    const plain = grantStatements({ schema: "s", worker: ["w"] }).join("\n");
    expect(plain).not.toMatch(/expire_dead_letters|DELETE ON "s".dead_letters/);
    const expirer = grantStatements({ schema: "s", worker: ["w"], workerCanExpire: true });
    expect(expirer).toContain(
      'GRANT EXECUTE ON FUNCTION "s".expire_dead_letters(double precision, integer) TO "w"',
    );
    expect(expirer.join("\n")).not.toMatch(/(DELETE|INSERT|UPDATE)[^\n]*dead_letters/);
  });

  it("gives the worker UPDATE of lease and bookkeeping columns only, and no write on dead letters", () => {
    const sql = grantStatements({ schema: "s", worker: ["w"] });
    const updates = sql.filter((x) => x.includes("UPDATE"));
    expect(updates).toEqual([
      'GRANT UPDATE (acquired_token, acquired_at, lease_expires_at, acquired_by, available_at, deliveries_count, attempts_count, failures_count, first_attempt_at, last_attempt_at, last_error, head) ON "s".messages TO "w"',
      // A transaction-held batch's guard: the repair keeps the ids of rows still locked (migration 0023), a
      // live worker narrows its failed batch's guard to the rows that ran (migration 0026).
      'GRANT UPDATE (ids, alone) ON "s".lease_guards TO "w"',
    ]);
    expect(sql.join("\n")).not.toMatch(/(INSERT|UPDATE|DELETE)[^\n]*dead_letters/);
    expect(sql).toContain(
      'GRANT EXECUTE ON FUNCTION "s".dead_letter(bigint[], uuid[], text[], text[], integer[], integer[], integer, boolean) TO "w"',
    );
  });

  it("gives the inspector no lease token", () => {
    const sql = grantStatements({ schema: "s", inspector: ["r"], inspectorCanRepair: true }).join("\n");
    expect(sql).not.toContain("acquired_token");
    expect(sql).toContain('GRANT SELECT ON "s".leases TO "r"');
  });

  it("lets the worker insert messages (follow-ups) only with workerCanFollowUp, and only the producer's columns", () => {
    expect(grantStatements({ schema: "s", worker: ["w"] }).join("\n")).not.toMatch(
      /INSERT .*ON "s".messages/,
    );
    const chainer = grantStatements({ schema: "s", worker: ["w"], workerCanFollowUp: true });
    expect(chainer).toContain(
      'GRANT INSERT (queue, payload, headers, key, available_at) ON "s".messages TO "w"',
    );
    // Follow-ups go to queues: no topic row, no fan-out.
    expect(chainer.join("\n")).not.toMatch(/[(, ]topic[,)]|fan_out|dedupe_key|cancel/);
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
