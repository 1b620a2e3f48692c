import { readFileSync } from "node:fs";

/** This package's version, from its package.json: two levels up from both src/migrate and dist/migrate. */
export function packageVersion(): string {
  const manifest = JSON.parse(readFileSync(new URL("../../package.json", import.meta.url), "utf8"));
  return String(manifest.version);
}

/**
 * Orders two release versions by SemVer precedence: negative when `a` is older. A pre-release comes before
 * its release (`0.2.0-rc.1` < `0.2.0-rc.2` < `0.2.0`: numeric identifiers compare as numbers, others as
 * text, a numeric one first); build metadata (`+…`) is ignored, so `0.2.0+a` and `0.2.0+b` are the same
 * version. Text that is not a version counts as 0.0.0, so it never outranks a real release.
 */
export function compareVersions(a: string, b: string): number {
  const [x, y] = [parse(a), parse(b)];
  for (let i = 0; i < 3; i++) {
    const d = (x.core[i] ?? 0) - (y.core[i] ?? 0);
    if (d !== 0) return Math.sign(d);
  }
  // A release outranks its pre-releases.
  if (x.pre.length === 0 || y.pre.length === 0) return Math.sign(y.pre.length - x.pre.length);
  for (let i = 0; i < Math.min(x.pre.length, y.pre.length); i++) {
    const d = compareIdentifiers(x.pre[i] ?? "", y.pre[i] ?? "");
    if (d !== 0) return d;
  }
  return Math.sign(x.pre.length - y.pre.length);
}

const VERSION = /^v?(\d+)\.(\d+)\.(\d+)(?:-([0-9A-Za-z.-]+))?(?:\+[0-9A-Za-z.-]+)?$/;

function parse(v: string): { core: number[]; pre: string[] } {
  const m = VERSION.exec(v.trim());
  if (!m) return { core: [0, 0, 0], pre: [] };
  return { core: [m[1], m[2], m[3]].map(Number), pre: m[4] ? m[4].split(".") : [] };
}

function compareIdentifiers(a: string, b: string): number {
  const [na, nb] = [/^\d+$/.test(a), /^\d+$/.test(b)];
  if (na && nb) return Math.sign(Number(a) - Number(b));
  if (na !== nb) return na ? -1 : 1;
  return a < b ? -1 : a > b ? 1 : 0;
}
