import fc from "fast-check";
import { beforeAll, describe, expect, it } from "vitest";
import { matchSegments, topicMatches } from "../../src/contract/topic.js";
import { testDatabase } from "../support/database.js";

/**
 * topicMatches is the database's routing rule in TypeScript (option checks, the CLI, AsyncAPI, the test
 * harness use it): the same answers as the rule it replaced and as Postgres, in steps that grow with the
 * pattern's segments times the topic's, never exponentially with its `#` segments.
 */

/** The regular expression topicMatches used to build (and topic_matcher still builds): the reference. */
function regexMatches(pattern: string, topic: string): boolean {
  const source = pattern
    .split(".")
    .map((s) => (s === "*" ? "\\.[^.]+" : s === "#" ? "(\\.[^.]+)*" : `\\.${s}`))
    .join("");
  return new RegExp(`^${source}$`).test(`.${topic}`);
}

// Few distinct segments, so literals collide with the topic's and wildcards meet every case.
const patternArb = fc
  .array(fc.constantFrom("a", "b", "*", "#"), { minLength: 1, maxLength: 7 })
  .map((s) => s.join("."));
const topicArb = fc.array(fc.constantFrom("a", "b"), { minLength: 1, maxLength: 8 }).map((s) => s.join("."));

describe("topicMatches", () => {
  it("answers as the regular expression it replaced, for every small pattern and topic", () => {
    fc.assert(
      fc.property(patternArb, topicArb, (pattern, topic) => {
        expect(topicMatches(pattern, topic)).toBe(regexMatches(pattern, topic));
      }),
      { numRuns: 5000 },
    );
  });

  it("agrees with the regex on topics with empty segments (not topic names, but the function takes any text)", () => {
    const loose = fc.array(fc.constantFrom("a", ""), { maxLength: 5 }).map((s) => s.join("."));
    fc.assert(
      fc.property(patternArb, loose, (pattern, topic) => {
        expect(topicMatches(pattern, topic)).toBe(regexMatches(pattern, topic));
      }),
      { numRuns: 2000 },
    );
  });

  it("takes at most (pattern segments + 1) × (topic segments + 1) steps: 40 # against 60 segments", () => {
    // Backtracking needs about 2^59 tries here to find there is no match; the pass over prefixes, 41 × 61.
    const pattern = [...Array.from({ length: 40 }, () => "#"), "x"];
    const topic = Array.from({ length: 60 }, (_, i) => `s${i}`);
    let steps = 0;
    expect(matchSegments(pattern, topic, () => steps++)).toBe(false);
    expect(steps).toBeLessThanOrEqual((pattern.length + 1) * (topic.length + 1));
    expect(topicMatches(pattern.join("."), topic.join("."))).toBe(false);
    expect(topicMatches(Array.from({ length: 40 }, () => "#").join("."), topic.join("."))).toBe(true);
  });
});

describe("topicMatches and the database", () => {
  const db = testDatabase("topicm");
  beforeAll(() => db.migrate());

  it("gives the database's answer for every pattern of up to 3 segments and topic of up to 4", async () => {
    const words = (alphabet: string[], max: number): string[] => {
      const all: string[][] = [];
      let level: string[][] = [[]];
      for (let i = 0; i < max; i++) {
        level = level.flatMap((w) => alphabet.map((c) => [...w, c]));
        all.push(...level);
      }
      return all.map((w) => w.join("."));
    };
    const patterns = words(["a", "*", "#"], 3);
    const topics = words(["a", "b"], 4);
    const { rows } = await db.pool.query<{ pattern: string; topic: string; matches: boolean }>(
      `SELECT p AS pattern, t AS topic, ('.' || t) ~ ${db.names.quotedSchema}.topic_matcher(p) AS matches
       FROM unnest($1::text[]) AS p CROSS JOIN unnest($2::text[]) AS t`,
      [patterns, topics],
    );
    expect(rows.length).toBe(patterns.length * topics.length);
    const differ = rows.filter((r) => topicMatches(r.pattern, r.topic) !== r.matches);
    expect(differ).toEqual([]);
  });
});
