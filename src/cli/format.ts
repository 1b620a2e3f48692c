import { scrubDeep } from "../util/redact.js";
import type { CliIo } from "./io.js";

export interface Column {
  header: string;
  /** Numbers read best right-aligned. */
  align?: "left" | "right";
}

/** Aligned columns under a header line, two spaces apart, no trailing blanks. */
export function renderTable(columns: readonly Column[], rows: readonly (readonly string[])[]): string {
  const widths = columns.map((c, i) => Math.max(c.header.length, ...rows.map((r) => (r[i] ?? "").length)));
  const line = (cells: readonly string[]) =>
    columns
      .map((c, i) => {
        const cell = cells[i] ?? "";
        const width = widths[i] ?? 0;
        return c.align === "right" ? cell.padStart(width) : cell.padEnd(width);
      })
      .join("  ")
      .trimEnd();
  return [line(columns.map((c) => c.header)), ...rows.map(line)].join("\n");
}

/**
 * Scrubbed value by value rather than as text (the console's scrub), so a secret made of digits cannot
 * cut into a number and leave invalid JSON.
 */
export function printJson(io: CliIo, value: unknown): void {
  io.stdout(`${JSON.stringify(scrubDeep(value), null, 2)}\n`);
}

/** "3.2 s", "42 s", "4 min", "2 h", "3 d"; "-" when there is no age. */
export function formatAge(seconds: number | null | undefined): string {
  if (seconds === null || seconds === undefined || !Number.isFinite(seconds)) return "-";
  const s = Math.max(0, seconds);
  if (s < 10) return `${(Math.floor(s * 10) / 10).toFixed(1)} s`;
  if (s < 60) return `${Math.floor(s)} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min`;
  if (s < 86_400) return `${Math.floor(s / 3600)} h`;
  return `${Math.floor(s / 86_400)} d`;
}

// Error texts and payloads come from handlers and producers: a raw ESC or carriage return in them could
// rewrite the operator's terminal, so control characters are always shown escaped.
function escapeControls(text: string, keepNewlines: boolean): string {
  return text.replace(/\p{Cc}/gu, (c) => {
    if (c === "\n") return keepNewlines ? "\n" : "\\n";
    if (c === "\t") return keepNewlines ? "\t" : "\\t";
    if (c === "\r") return "\\r";
    return `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`;
  });
}

/** Free text for a multi-line view: newlines kept, other control characters escaped. */
export function safeText(text: string): string {
  return escapeControls(text, true);
}

/** One table cell: on one line, at most `max` characters, "…" when cut; "-" for nothing. */
export function cell(text: string | null | undefined, max = Number.POSITIVE_INFINITY): string {
  if (text === null || text === undefined || text === "") return "-";
  const flat = escapeControls(text, false);
  return flat.length > max ? `${flat.slice(0, Math.max(0, max - 1))}…` : flat;
}

/** A JSON value as compact text, for a table cell. */
export function jsonCell(value: unknown, max: number): string {
  return cell(JSON.stringify(value), max);
}
