// Lists the longest functions of src/ (declarations, methods, arrows, function expressions), to keep
// closures small: npx tsx scripts/function-lengths.ts [minLines=80] [top=10]
import { readdirSync, readFileSync } from "node:fs";
import path from "node:path";
import ts from "typescript";

const minLines = Number(process.argv[2] ?? 80);
const top = Number(process.argv[3] ?? 10);

function sources(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((entry) => {
    const full = path.join(dir, entry.name);
    if (entry.isDirectory()) return sources(full);
    return entry.name.endsWith(".ts") ? [full] : [];
  });
}

/** The name a reader would look for: the function's own, or the variable or property it is assigned to. */
function nameOf(node: ts.FunctionLikeDeclaration, file: ts.SourceFile): string {
  if (node.name) return node.name.getText(file);
  const parent = node.parent;
  if ((ts.isVariableDeclaration(parent) || ts.isPropertyAssignment(parent)) && parent.name) {
    return parent.name.getText(file);
  }
  return "(anonymous)";
}

/** Lines holding code: blank lines and comments do not count; a multi-line string counts every line. */
function codeLines(node: ts.Node, file: ts.SourceFile): number {
  const lines = new Set<number>();
  const line = (pos: number) => file.getLineAndCharacterOfPosition(pos).line;
  const walk = (n: ts.Node): void => {
    if (n.kind >= ts.SyntaxKind.FirstJSDocNode && n.kind <= ts.SyntaxKind.LastJSDocNode) return;
    const children = n.getChildren(file);
    if (children.length === 0) {
      for (let l = line(n.getStart(file)); l <= line(n.getEnd()); l++) lines.add(l);
      return;
    }
    for (const child of children) walk(child);
  };
  walk(node);
  return lines.size;
}

const found: { lines: number; code: number; where: string; name: string }[] = [];
for (const file of sources("src")) {
  const source = ts.createSourceFile(file, readFileSync(file, "utf8"), ts.ScriptTarget.Latest, true);
  const visit = (node: ts.Node): void => {
    if (ts.isFunctionLike(node) && "body" in node && node.body) {
      const fn = node as ts.FunctionLikeDeclaration;
      const start = source.getLineAndCharacterOfPosition(fn.getStart(source)).line;
      const end = source.getLineAndCharacterOfPosition(fn.getEnd()).line;
      const lines = end - start + 1;
      const code = codeLines(fn, source);
      if (code >= minLines)
        found.push({ lines, code, where: `${file}:${start + 1}`, name: nameOf(fn, source) });
    }
    ts.forEachChild(node, visit);
  };
  visit(source);
}
found.sort((a, b) => b.code - a.code);
console.log(" code  lines  function");
for (const f of found.slice(0, top)) {
  console.log(`${String(f.code).padStart(5)}  ${String(f.lines).padStart(5)}  ${f.name}  ${f.where}`);
}
