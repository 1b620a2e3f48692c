import { readFileSync } from "node:fs";

/** This package's version, from its package.json: two levels up from both src/migrate and dist/migrate. */
export function packageVersion(): string {
  const manifest = JSON.parse(readFileSync(new URL("../../package.json", import.meta.url), "utf8"));
  return String(manifest.version);
}

/**
 * Orders two release versions by major.minor.patch (a pre-release counts as its release): negative when `a`
 * is older. Text that is not a version counts as 0.0.0, so it never outranks a real release.
 */
export function compareVersions(a: string, b: string): number {
  const parts = (v: string) => (/^(\d+)\.(\d+)\.(\d+)/.exec(v)?.slice(1) ?? ["0", "0", "0"]).map(Number);
  const [x, y] = [parts(a), parts(b)];
  for (let i = 0; i < 3; i++) {
    const d = (x[i] ?? 0) - (y[i] ?? 0);
    if (d !== 0) return d;
  }
  return 0;
}
