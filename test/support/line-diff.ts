/**
 * The lines that differ between two texts, as `-` (only in `expected`) and `+` (only in `actual`) with a
 * line of context each side and `@@ line n` headers; empty when they are equal. Longest common subsequence
 * over lines: schema.sql is under a thousand lines.
 */
export function lineDiff(expected: string, actual: string, context = 1): string {
  const a = expected.split("\n");
  const b = actual.split("\n");
  const lcs: number[][] = Array.from({ length: a.length + 1 }, () => new Array<number>(b.length + 1).fill(0));
  for (let i = a.length - 1; i >= 0; i--) {
    for (let j = b.length - 1; j >= 0; j--) {
      const row = lcs[i] as number[];
      row[j] =
        a[i] === b[j] ? (lcs[i + 1]?.[j + 1] ?? 0) + 1 : Math.max(lcs[i + 1]?.[j] ?? 0, row[j + 1] ?? 0);
    }
  }
  const ops: { kind: " " | "-" | "+"; line: string; at: number }[] = [];
  let [i, j] = [0, 0];
  while (i < a.length || j < b.length) {
    if (i < a.length && j < b.length && a[i] === b[j]) {
      ops.push({ kind: " ", line: a[i] as string, at: i + 1 });
      i++;
      j++;
    } else if (j < b.length && (i >= a.length || (lcs[i]?.[j + 1] ?? 0) >= (lcs[i + 1]?.[j] ?? 0))) {
      ops.push({ kind: "+", line: b[j] as string, at: i + 1 });
      j++;
    } else {
      ops.push({ kind: "-", line: a[i] as string, at: i + 1 });
      i++;
    }
  }
  const shown = ops.map((_op, k) =>
    ops.slice(Math.max(0, k - context), k + context + 1).some((o) => o.kind !== " "),
  );
  const out: string[] = [];
  ops.forEach((op, k) => {
    if (!shown[k]) return;
    if (k === 0 || !shown[k - 1]) out.push(`@@ line ${op.at}`);
    out.push(`${op.kind} ${op.line}`);
  });
  return out.join("\n");
}
