const UNIT_MS = { s: 1000, m: 60_000, h: 3_600_000, d: 86_400_000 } as const;

/**
 * A human age such as "7d", "12h", "30m" or "90s": a positive whole number and one unit, nothing else.
 * Shared by the CLI's `--older-than` and the console's purge, so both accept exactly the same text.
 */
export function parseDuration(text: string, field: string): number {
  const match = /^([1-9][0-9]{0,5})([smhd])$/.exec(text);
  if (!match) {
    throw new RangeError(
      `${field} must be a positive whole number followed by s, m, h or d (e.g. 30m, 12h, 7d), got ${JSON.stringify(text)}`,
    );
  }
  return Number(match[1]) * UNIT_MS[match[2] as keyof typeof UNIT_MS];
}
