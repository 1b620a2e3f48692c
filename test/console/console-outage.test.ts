import { describe, expect, it } from "vitest";
import { describeDatabase, unavailableReason } from "../../src/console/outage.js";

describe("console outage answers", () => {
  it("names the database by host, port and name, never by user, password or parameters", () => {
    expect(
      describeDatabase("postgres://app:s3cret-pw@db.internal:6432/orders?sslmode=require&password=p2"),
    ).toBe('database "orders" at db.internal:6432');
    expect(describeDatabase("postgresql://app@/orders?host=/var/run/postgresql")).toBe(
      'database "orders" at /var/run/postgresql:5432',
    );
    expect(describeDatabase("postgres://token-user:t0ken@db.example")).toBe(
      "the database at db.example:5432",
    );
    expect(describeDatabase("not a url with password=x")).toBe("the database");
    expect(describeDatabase(undefined)).toBe("the database");
  });

  it("tells an unreachable database from other failures", () => {
    const withCode = (code: string) => Object.assign(new Error("x"), { code });
    expect(unavailableReason(withCode("ECONNREFUSED"))).toBe("connection refused");
    expect(unavailableReason(withCode("57P03"))).toBe("the server is starting up");
    expect(unavailableReason(withCode("08006"))).toBe("connection failure");
    expect(unavailableReason(new Error("Connection terminated unexpectedly"))).toBe("connection lost");
    expect(unavailableReason(new Error("timeout exceeded when trying to connect"))).toBe(
      "connection timed out",
    );
    expect(unavailableReason(new Error("Query read timeout"))).toBe("no answer in time");
    // Anything else stays a 500: a missing table or a bug is not an outage.
    expect(unavailableReason(withCode("42P01"))).toBeUndefined();
    expect(unavailableReason(new Error("boom"))).toBeUndefined();
  });
});
