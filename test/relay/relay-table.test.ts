import { describe, expect, it } from "vitest";
import { renderRelayOptionsTable } from "../../src/relay/options-table.js";
import { readDoc } from "../support/docs.js";

describe("relay options table", () => {
  it("the docs' relay table is the one the relay schemas produce", () => {
    const table = readDoc("docs/reference/relay-options.md")
      .split("<!-- relay-table:start -->")[1]
      ?.split("<!-- relay-table:end -->")[0]
      ?.trim();
    // Compared cell by cell: a formatter may pad Markdown tables. Regenerate with: npm run -s docs:relays
    const cells = (markdown: string | undefined) =>
      (markdown ?? "")
        .split("\n")
        .filter((line) => !/^\|\s*-/.test(line))
        .map((line) => line.split("|").map((cell) => cell.trim()));
    expect(cells(table)).toEqual(cells(renderRelayOptionsTable()));
  });

  it("documents every option of every relay, with the {queue} placeholder where it applies", () => {
    const table = renderRelayOptionsTable();
    for (const option of [
      "stream",
      "declareQueue",
      "maxLen",
      "timeoutMs",
      "method",
      "headers",
      "exchangeType",
    ]) {
      expect(table).toContain(`\`${option}\``);
    }
    const rows = table.split("\n").slice(2);
    expect(rows.filter((row) => row.endsWith("|  |") || row.endsWith("| |"))).toEqual([]);
    for (const [relay, option] of [
      ["redis", "stream"],
      ["nats", "subject"],
      ["rabbitmq", "routingKey"],
    ]) {
      const row = rows.find((r) => r.startsWith(`| ${relay} | \`${option}\``));
      expect(row, `${relay}.${option}`).toContain("`{queue}`");
    }
  });
});
