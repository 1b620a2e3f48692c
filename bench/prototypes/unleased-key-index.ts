/**
 * A design not in the product, measured in whole drains before building it: the key index without leased
 * rows, and key_heads for the producer's trigger (unleased-key-index.sql says what and why).
 *
 * Rounds of three drains back to back, as the ordering bench's 6a (`bench/job.ts`, 50,000 rows, one worker,
 * default options but the concurrency): keyless, over 10,000 keys as the product is, and over 10,000 keys
 * with the prototype applied. Prints each drain's rate and CPU per message, then the medians and
 * each keyed drain's ratio to the keyless drain of its own round (the machine drifts between rounds).
 *
 *   node --import tsx bench/prototypes/unleased-key-index.ts --rounds 8 --concurrency 10
 */
import type { DrainResult, JobSpec } from "../job.js";
import { arg, median, range, runJob } from "../lib.js";

const rounds = Number(arg("rounds", "8"));
const concurrency = Number(arg("concurrency", "10"));
const base = { kind: "drain", peer: "outbox", concurrency, rows: 50_000 } as const;
const modes = {
  keyless: base,
  keyed: { ...base, keys: 10_000 },
  prototype: { ...base, keys: 10_000, variant: "unleased-key-index" },
} satisfies Record<string, JobSpec>;
type Mode = keyof typeof modes;

const results: Record<Mode, DrainResult[]> = { keyless: [], keyed: [], prototype: [] };
for (let round = 1; round <= rounds; round++) {
  for (const mode of Object.keys(modes) as Mode[]) {
    const r = await runJob<DrainResult>(modes[mode]);
    if ((r.orderViolations ?? 0) > 0) throw new Error(`${mode}: ${r.orderViolations} order violations`);
    results[mode].push(r);
    console.log(
      `round ${round} ${mode.padEnd(9)} ${Math.round(r.rate)} rows/s, CPU µs/msg worker ${r.cpuNode.toFixed(1)}, rest ${r.cpuRest.toFixed(1)}`,
    );
  }
}

const ratios = (mode: Mode) => results[mode].map((r, i) => r.rate / (results.keyless[i] as DrainResult).rate);
console.log(`\nconcurrency ${concurrency}, ${rounds} rounds: median (range)`);
console.log("| drain | rows/s | ÷ keyless, per round | CPU µs/msg, worker | CPU µs/msg, rest |");
console.log("| --- | ---: | ---: | ---: | ---: |");
for (const mode of Object.keys(modes) as Mode[]) {
  const rs = results[mode];
  const ratio = mode === "keyless" ? "–" : `${median(ratios(mode)).toFixed(2)}× (${range(ratios(mode), 2)})`;
  console.log(
    `| ${mode} | ${Math.round(median(rs.map((r) => r.rate)))} | ${ratio} | ${median(rs.map((r) => r.cpuNode)).toFixed(1)} | ${median(rs.map((r) => r.cpuRest)).toFixed(1)} |`,
  );
}
const wins = results.prototype.filter((r, i) => r.rate > (results.keyed[i] as DrainResult).rate).length;
console.log(`\nprototype faster than keyed in ${wins} of ${rounds} rounds`);
